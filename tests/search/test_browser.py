"""The search page in a real browser: Debian's chromium driven by Selenium through Debian's chromium-driver
(tests/search/browser_support.py; `make test` installs them, and without them the test skips, except
under CI, where it fails).

The page types a query, shows the results the API returns, draws the kept-patch overlays, and renders a word's
heatmap when the pointer is over the word (checked on screenshots: the result's pixels change).
"""

from __future__ import annotations

import io
import json
import urllib.request

import numpy as np
import pytest
from browser_support import browser_fixture  # noqa: F401 - the fixture `browser`
from browser_support import open_page as _open_page
from PIL import Image

from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app
from search_support import caption_queries, live_server, search_env

pytestmark = pytest.mark.usefixtures("one_thread")


def _query_with_visible_heat(searcher: Searcher, captions: list[str]) -> tuple[str, int]:
    """A caption whose best result has a word aligned with patches (not the CLS token), and that word."""
    for caption in captions:
        top = searcher.search(caption, k=1).hits[0]
        for w, word in enumerate(searcher.explain(caption, top.id).words):
            if word.best_token != "cls" and float(word.heat.clamp_min(0).max()) > 0:
                return caption, w
    raise AssertionError("no caption of the tiny index aligns a word with patches")


def _canvas_pixels(png: bytes, rect: dict) -> np.ndarray:
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    x, y = int(rect["x"]), int(rect["y"])
    return image[y : y + int(rect["height"]), x : x + int(rect["width"])]


def test_the_page_searches_and_renders_kept_patches_and_a_word_heatmap(tmp_path_factory, tmp_path, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    env = search_env(tmp_path_factory)
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    captions, _ = caption_queries(env)
    caption, word = _query_with_visible_heat(searcher, captions)
    k = 6
    with live_server(create_app(searcher)) as url:
        _open_page(browser, url)
        box = browser.find_element(By.ID, "q")
        box.clear()
        box.send_keys(caption)
        k_box = browser.find_element(By.ID, "k")
        k_box.clear()
        k_box.send_keys(str(k))
        box.send_keys(Keys.ENTER)
        wait = WebDriverWait(browser, 120)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, '.result[data-explained="true"]')) == k)
        # every image has loaded and been drawn
        wait.until(
            lambda d: d.execute_script("return [...window.patchword.cards.values()].every(e => e.image)")
        )
        cards = browser.find_elements(By.CSS_SELECTOR, ".result")
        with urllib.request.urlopen(f"{url}/api/search?q={urllib.parse.quote(caption)}&k={k}") as response:
            api = json.load(response)
        assert [c.get_attribute("data-path") for c in cards] == [r["path"] for r in api["results"]]
        assert [int(c.get_attribute("data-id")) for c in cards] == [r["id"] for r in api["results"]]
        canvas = cards[0].find_element(By.TAG_NAME, "canvas")
        assert "kept patches: sparse 8, dense 8 of 16" in cards[0].text
        # what a screen reader says of a result and of a word (old code: an unnamed canvas, a bare span)
        top = api["results"][0]
        assert canvas.get_attribute("role") == "img"
        assert canvas.get_attribute("aria-label") == f"rank 1: {top['path']}, score {top['score']:.4f}"
        chips = browser.find_elements(By.CSS_SELECTOR, "#words .word")
        assert chips and all(c.get_attribute("role") == "button" for c in chips)
        legend = browser.find_element(By.ID, "legend")
        assert "cyan" in legend.text and "dense-caption-guided one (orange, dashed)" in legend.text

        rect = canvas.rect
        before = browser.get_screenshot_as_png()
        (tmp_path / "before.png").write_bytes(before)
        chip = browser.find_element(By.CSS_SELECTOR, f'#words .word[data-index="{word}"]')
        ActionChains(browser).move_to_element(chip).perform()
        wait.until(lambda d: canvas.get_attribute("data-heat-word") == str(word))
        after = browser.get_screenshot_as_png()
        (tmp_path / "after.png").write_bytes(after)

        assert canvas.rect == rect  # the layout did not move: the same pixels are compared
        changed = np.abs(_canvas_pixels(before, rect) - _canvas_pixels(after, rect)).max(axis=-1) > 24
        assert changed.mean() > 0.3, f"heatmap changed only {changed.mean():.1%} of the result's pixels"
        # hot (red-yellow) pixels appear where the word's heat is highest
        hot = _canvas_pixels(after, rect)
        assert ((hot[..., 0] > 200) & (hot[..., 2] < 80)).any()
        # moving away restores the kept-patch overlay
        ActionChains(browser).move_to_element(browser.find_element(By.ID, "q")).perform()
        wait.until(lambda d: canvas.get_attribute("data-heat-word") == "")
        restored = browser.get_screenshot_as_png()
        assert np.array_equal(_canvas_pixels(restored, rect), _canvas_pixels(before, rect))


def test_the_page_shows_unknown_query_words_as_a_note_above_the_results(tmp_path_factory, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    env = search_env(tmp_path_factory)
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    expected = searcher.search("a red zzzqqq circle", k=3).warning
    shots = tmp_path

    def submit(query: str) -> None:
        box = browser.find_element(By.ID, "q")
        box.clear()
        box.send_keys(query)
        k_box = browser.find_element(By.ID, "k")
        k_box.clear()
        k_box.send_keys("3")
        box.send_keys(Keys.ENTER)

    with live_server(create_app(searcher)) as url:
        wait = _open_page(browser, url)
        note = browser.find_element(By.ID, "note")
        assert not note.is_displayed()
        submit("a red zzzqqq circle")
        wait.until(lambda d: note.is_displayed())
        assert note.text == expected and "'zzzqqq'" in note.text
        results = browser.find_element(By.ID, "results")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result")) == 3)
        assert note.rect["y"] + note.rect["height"] <= results.rect["y"] + 1  # above (rects are rounded)
        browser.get_screenshot_as_file(str(shots / "note.png"))
        submit("zzzqqq xxyyzz")  # no known word: the error is the status line, the note goes
        status = browser.find_element(By.ID, "status")
        wait.until(lambda d: "knows none of the query's words" in status.text)
        assert not note.is_displayed() and "error" in status.get_attribute("class")
        submit("a red circle")
        wait.until(lambda d: "results in" in status.text)
        assert not note.is_displayed()


def test_the_page_keeps_k_within_the_servers_max_k(tmp_path_factory, browser):
    """Old code: the page's k box had max 100 and value 10 whatever ``--max-k`` said, and its script clamped
    to 100: with ``--max-k 7`` the page's default search was a 400 (k=10 out of range) and the box let k
    up to 100 through."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    env = search_env(tmp_path_factory)
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    with live_server(create_app(searcher, ServeLimits(max_k=7))) as url:
        wait = _open_page(browser, url)
        k_box = browser.find_element(By.ID, "k")
        assert (k_box.get_attribute("max"), k_box.get_attribute("value")) == ("7", "7")
        box = browser.find_element(By.ID, "q")
        box.send_keys("a red circle")
        box.send_keys(Keys.ENTER)  # the default k, the server's
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result")) == 7)
        k_box.clear()
        k_box.send_keys("5")
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result")) == 5)
        k_box.clear()
        k_box.send_keys("50")  # more than the server allows: the form says so, nothing is asked
        assert browser.execute_script("return document.getElementById('k').validity.rangeOverflow")
        status = browser.find_element(By.ID, "status")
        assert "error" not in (status.get_attribute("class") or "")


def test_the_page_shows_what_the_index_approximates_and_lacks_above_the_results(
    tmp_path_factory, tmp_path, browser
):
    """Old code: the page showed none of the index's notes or warnings (an int8 index built without the
    dense captions its model reads looked like the exact search)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from patchword.search.index import build_index

    env = search_env(tmp_path_factory)
    build_index(env.run, env.export.files["images"], tmp_path / "int8", dtype="int8")  # no --dense
    searcher = Searcher(SearchIndex.open(tmp_path / "int8"), env.run)
    info = searcher.index_info  # the warnings name the run and the index by their folder names
    with live_server(create_app(searcher)) as url:
        wait = _open_page(browser, url)
        line = browser.find_element(By.ID, "index-note")
        assert not line.is_displayed()  # nothing said before an answer
        box = browser.find_element(By.ID, "q")
        box.send_keys(caption_queries(env)[0][0])
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result")) > 0)
        wait.until(lambda d: line.is_displayed())
        assert line.text == "approximate: int8 store; dense captions missing" == info["summary"]
        assert line.get_attribute("title").split("\n") == [*info["notes"], *info["warnings"]]
        results = browser.find_element(By.ID, "results")
        assert line.rect["y"] + line.rect["height"] <= results.rect["y"] + 1  # above the results
        assert line.rect["height"] < 40  # one line
        # no dense captions: the legend names no dense-caption outline (old code: it always did)
        legend = browser.find_element(By.ID, "legend")
        wait.until(lambda d: legend.is_displayed())
        assert "cyan" in legend.text and "dense-caption" not in legend.text

    # the exact index with its dense captions: no line
    exact = Searcher(SearchIndex.open(env.index_dir), env.run)
    with live_server(create_app(exact)) as url:
        wait = _open_page(browser, url)
        box = browser.find_element(By.ID, "q")
        box.send_keys(caption_queries(env)[0][0])
        box.send_keys(Keys.ENTER)
        status = browser.find_element(By.ID, "status")
        wait.until(lambda d: "results in" in status.text)
        assert not browser.find_element(By.ID, "index-note").is_displayed()
