"""Run recipes shipped with patchword (YAML files read by ``patchword.runs.config.recipe_path``)."""
