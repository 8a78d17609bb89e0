"""``patchword serve``: a web page and a JSON API over a search index (FastAPI + uvicorn, the optional
extra ``serve``: ``pip install 'patchword[serve]'``).

- :mod:`.app`: :func:`~patchword.serve.app.create_app`, the routes, bounds and worker pool;
- :mod:`.params`: the requests' parameters; :mod:`.images`: the image files sent;
- :mod:`.reload`: the index served, reopened when it changes on disk;
- :mod:`.cli`: ``main_serve(argv)``;
- ``static/``: the one page (plain HTML, JavaScript and CSS; no build step, nothing from a CDN).

Importing this package does not import FastAPI; :func:`~patchword.serve.app.create_app` raises
:class:`~patchword.errors.MissingExtraError` when the extra is missing.
"""

from patchword.serve.app import ServeLimits, create_app, require_serve_extra

__all__ = ["ServeLimits", "create_app", "require_serve_extra"]
