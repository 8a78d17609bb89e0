"""The search page shows what belongs to the search on screen (chromium: tests/search/browser_support.py).

Old code: a failing explanation of an older search wrote "no explanation" on the new search's cards; an
image that did not load left a blank card (the server's message never shown); a failed search left the
previous query's cards, words and legend on screen; the address never recorded the query (a reload lost
it); the k box read "1e2" as 1; the query box's length was 512 whatever ``--max-query-chars`` said; one
result was "1 results".
"""

from __future__ import annotations

import pytest
from browser_support import (
    browser_fixture,  # noqa: F401 - the fixture `browser`
    open_page,
    submit,
)

from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app
from search_support import live_server, served_copy

pytestmark = pytest.mark.usefixtures("one_thread")

CARDS = ".result"
EXPLAINED = '.result[data-explained="true"]'

# Explanation requests of the query given never answer until the test lets them fail (RELEASE_HELD):
# what a slow server does to a search the user has already replaced.
HOLD_OLD_EXPLANATIONS = """
const old = arguments[0];
const realFetch = window.fetch;
window.held = [];
window.fetch = (url, options) => {
  if (String(url).startsWith("/api/explain") && String(url).includes(`q=${encodeURIComponent(old)}&`)) {
    return new Promise((resolve, reject) => window.held.push(reject));
  }
  return realFetch(url, options);
};
"""
# Fail the held requests, then answer once every reaction to that has run (a task after their microtasks).
RELEASE_HELD = """
const done = arguments[arguments.length - 1];
window.held.forEach((reject) => reject(new Error("slow failure")));
setTimeout(done, 0);
"""


def _count(browser, selector: str) -> int:
    from selenium.webdriver.common.by import By

    return len(browser.find_elements(By.CSS_SELECTOR, selector))


def test_an_older_searchs_failing_explanations_leave_the_new_cards_alone(searcher, browser):
    from selenium.webdriver.common.by import By

    with live_server(create_app(searcher)) as url:
        wait = open_page(browser, url)
        browser.execute_script(HOLD_OLD_EXPLANATIONS, "a red circle")
        submit(browser, "a red circle", 24)  # every image: the new search's cards have the same ids
        wait.until(lambda d: _count(d, CARDS) == 24 and d.execute_script("return window.held.length") == 4)
        submit(browser, "a blue square", 24)
        wait.until(lambda d: _count(d, EXPLAINED) == 24)
        browser.execute_async_script(RELEASE_HELD)
        whys = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".result .why")]
    assert len(whys) == 24 and all(w.startswith("kept patches:") for w in whys), whys


def test_a_missing_image_shows_the_servers_message_on_its_card(env, tmp_path, browser):
    from selenium.webdriver.common.by import By

    folder, out, _ = served_copy(env, tmp_path)
    searcher = Searcher(SearchIndex.open(out), env.run)
    (folder / searcher.index.path(5)).unlink()
    with live_server(create_app(searcher)) as url:
        wait = open_page(browser, url)
        submit(browser, "a red circle", 24)
        card = '.result[data-id="5"] .problem'
        wait.until(lambda d: _count(d, card) == 1 and d.find_element(By.CSS_SELECTOR, card).is_displayed())
        assert browser.find_element(By.CSS_SELECTOR, card).text == "the file of image 5 no longer exists"
        wait.until(
            lambda d: (
                d.execute_script("return [...window.patchword.cards.values()].filter(e => e.image).length")
                == 23
            )
        )
        shown = [e for e in browser.find_elements(By.CSS_SELECTOR, ".result .problem") if e.is_displayed()]
        assert len(shown) == 1  # the other images loaded


def test_a_failed_search_clears_the_previous_results(searcher, browser):
    from selenium.webdriver.common.by import By

    with live_server(create_app(searcher)) as url:
        wait = open_page(browser, url)
        submit(browser, "a red circle", 3)
        wait.until(lambda d: _count(d, EXPLAINED) == 3)
        assert browser.find_element(By.ID, "words-bar").is_displayed()
        assert browser.find_element(By.ID, "legend").is_displayed()
        submit(browser, "zzzqqq xxyyzz", 3)  # no known word: a 400
        status = browser.find_element(By.ID, "status")
        wait.until(lambda d: "knows none of the query's words" in status.text)
        assert _count(browser, CARDS) == 0
        assert not browser.find_element(By.ID, "words-bar").is_displayed()
        assert not browser.find_element(By.ID, "legend").is_displayed()


def test_the_address_records_the_search_and_a_page_opened_at_it_searches(searcher, browser):
    from selenium.webdriver.common.by import By

    def boxes(d) -> tuple[str, str]:
        return d.find_element(By.ID, "q").get_attribute("value"), d.find_element(By.ID, "k").get_attribute(
            "value"
        )

    with live_server(create_app(searcher)) as url:
        wait = open_page(browser, url, "/?q=a+red+circle&k=3")
        wait.until(lambda d: _count(d, EXPLAINED) == 3)
        assert boxes(browser) == ("a red circle", "3")
        submit(browser, "a blue square", 2)
        wait.until(lambda d: _count(d, EXPLAINED) == 2 and boxes(d)[0] == "a blue square")
        assert browser.current_url == f"{url}/?q=a+blue+square&k=2"
        browser.refresh()  # the search again, not an empty page
        wait.until(lambda d: _count(d, EXPLAINED) == 2)
        assert boxes(browser) == ("a blue square", "2")
        paths = [c.get_attribute("data-path") for c in browser.find_elements(By.CSS_SELECTOR, CARDS)]
        assert paths == [h.path for h in searcher.search("a blue square", 2).hits]


def test_the_boxes_follow_the_servers_limits_and_count_results(searcher, browser):
    from selenium.webdriver.common.by import By

    with live_server(create_app(searcher, ServeLimits(max_query_chars=30))) as url:
        wait = open_page(browser, url)
        assert browser.find_element(By.ID, "q").get_attribute("maxlength") == "30"
        browser.execute_script("document.getElementById('k').value = '1e2'")  # a number: 100, not 1
        submit(browser, "a red circle")
        status = browser.find_element(By.ID, "status")
        wait.until(lambda d: _count(d, CARDS) == 24)  # k=100: every image of the 24
        assert status.text.startswith("24 results in")
        assert browser.find_element(By.ID, "k").get_attribute("value") == "100"
        submit(browser, "a red circle", 1)
        wait.until(lambda d: _count(d, CARDS) == 1 and "in" in status.text)
        assert status.text.startswith("1 result in")
