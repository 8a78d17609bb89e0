// patchword search page: query box, result grid, kept-patch overlays and word heatmaps.
// Plain JavaScript, no build step, nothing loaded from elsewhere. Text from the server is only ever set
// through textContent, never parsed as HTML.
"use strict";

(() => {
  const CANVAS = 256; // drawing resolution of each result (the CSS scales it)
  const EXPLAIN_CONCURRENCY = 4;
  const state = {
    seq: 0, // search number; answers of an older search are dropped
    query: "",
    version: "", // the index version of the search's ids: images and explanations ask for that one
    results: [],
    cards: new Map(), // id -> {card, canvas, why, image, explain}
    words: [],
    activeWord: null,
    maxK: null, // the server's --max-k and default k (/healthz); until they arrive the server decides
    defaultK: null,
  };
  window.patchword = state; // inspectable from the console

  const $ = (id) => document.getElementById(id);

  function setStatus(text, isError = false) {
    $("status").textContent = text;
    $("status").classList.toggle("error", isError);
  }

  // A note above the results (the query words the model does not know); empty text hides it.
  function setNote(text) {
    $("note").textContent = text || "";
    $("note").hidden = !text;
  }

  // One line above the results saying what the index answering approximates and what it lacks (the
  // server's index.summary, e.g. "approximate: pq store; dense captions missing"); the full sentences
  // (index.notes, index.warnings) are its tooltip. An exact index without warnings: no line.
  function setIndexNote(index) {
    const line = (index && index.summary) || "";
    $("index-note").textContent = line;
    $("index-note").title = index ? [...(index.notes || []), ...(index.warnings || [])].join("\n") : "";
    $("index-note").hidden = !line;
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    let body = null;
    try {
      body = await response.json();
    } catch (err) {
      body = { error: `HTTP ${response.status}` };
    }
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    return body;
  }

  // ------------------------------------------------------------------ search
  function onSubmit(event) {
    event.preventDefault();
    search();
  }

  // The k asked for: the box's number (valueAsNumber reads "1e2" as 100, not 1), the server's default when
  // the box is empty (null until /healthz answered: the server decides); NaN when it is no allowed k.
  function askedK() {
    const box = $("k");
    if (box.value === "") return state.defaultK;
    const k = box.valueAsNumber;
    return Number.isInteger(k) && k >= 1 && (!state.maxK || k <= state.maxK) ? k : NaN;
  }

  // No results, words or legend: before an answer is drawn, and after a search that failed.
  function clearResults() {
    state.results = [];
    state.cards.clear();
    state.activeWord = null;
    $("results").replaceChildren();
    $("words").replaceChildren();
    $("words-bar").hidden = true;
    $("legend").hidden = true;
  }

  async function search() {
    const query = $("q").value.trim();
    if (!query) return;
    const k = askedK();
    if (Number.isNaN(k)) {
      setStatus(`k must be a whole number from 1 to ${state.maxK || "the server's --max-k"}`, true);
      return;
    }
    if (k) $("k").value = String(k);
    // the URL says what is searched: a reload searches again, and the address can be shared
    const shown = new URLSearchParams(k ? { q: query, k: String(k) } : { q: query });
    history.replaceState(null, "", `?${shown}`);
    const seq = ++state.seq;
    setStatus("searching…");
    let body;
    try {
      const kParam = k ? `&k=${k}` : "";
      body = await getJSON(`/api/search?q=${encodeURIComponent(query)}${kParam}`);
    } catch (err) {
      if (seq === state.seq) {
        setStatus(err.message, true);
        setNote("");
        clearResults(); // the previous query's cards would pass for this one's
      }
      return;
    }
    if (seq !== state.seq) return;
    setIndexNote(body.index); // each answer's own: the server reopens an updated index
    setNote(body.warning);
    clearResults();
    state.query = body.query;
    state.version = body.version || "";
    state.results = body.results;
    const count = body.results.length;
    const found = `${count} ${count === 1 ? "result" : "results"}`;
    setStatus(`${found} in ${body.ms.toFixed(1)} ms (${body.shortlist} re-ranked)`);
    renderResults(body.results, state.version);
    explainAll(seq, body.query, state.version, body.results.map((r) => r.id));
  }

  // `?version=...` (empty: none) so an id is never read in another version of the index (the server answers
  // 409 when it was updated since the search) and each version's image is cached under its own URL.
  function versionParam(version, first) {
    return version ? `${first ? "?" : "&"}version=${encodeURIComponent(version)}` : "";
  }

  function renderResults(results, version) {
    const grid = $("results");
    results.forEach((result, i) => {
      const card = document.createElement("article");
      card.className = "result";
      card.dataset.id = String(result.id);
      card.dataset.path = result.path;
      card.dataset.rank = String(i + 1);
      card.dataset.explained = "false";
      const canvas = document.createElement("canvas");
      canvas.width = CANVAS;
      canvas.height = CANVAS;
      canvas.dataset.heatWord = "";
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `rank ${i + 1}: ${result.path}, score ${result.score.toFixed(4)}`);
      const meta = document.createElement("div");
      meta.className = "meta";
      const line = document.createElement("div");
      line.textContent = `#${i + 1}  score ${result.score.toFixed(4)}  (global ${result.global_score.toFixed(4)})`;
      const path = document.createElement("div");
      path.className = "path";
      path.textContent = result.path;
      const why = document.createElement("div");
      why.className = "why";
      const problem = document.createElement("div"); // why the image is not shown, when it is not
      problem.className = "problem";
      problem.hidden = true;
      meta.append(line, path, why, problem);
      card.append(canvas, meta);
      grid.append(card);
      const entry = { card, canvas, why, image: null, explain: null };
      state.cards.set(result.id, entry);
      const image = new Image();
      image.onload = () => {
        entry.image = image;
        draw(entry);
      };
      image.onerror = () => showImageProblem(image.src, problem);
      image.src = `/api/image/${result.id}${versionParam(version, true)}`;
    });
  }

  // An image that did not load: the server's message (a JSON error such as "the file of image 7 no longer
  // exists", or the 409 of an index updated since the search) on its card.
  async function showImageProblem(url, problem) {
    let message = "the image cannot be shown";
    try {
      await getJSON(url);
    } catch (err) {
      message = err.message;
    }
    problem.textContent = message;
    problem.hidden = false;
  }

  async function explainAll(seq, query, version, ids) {
    const queue = ids.slice();
    async function worker() {
      while (queue.length && seq === state.seq) {
        const id = queue.shift();
        try {
          const url = `/api/explain?q=${encodeURIComponent(query)}&id=${id}${versionParam(version, false)}`;
          const body = await getJSON(url);
          if (seq !== state.seq) return;
          const entry = state.cards.get(id);
          if (!entry) continue;
          entry.explain = body;
          entry.card.dataset.explained = "true";
          if ($("words").childElementCount === 0) {
            renderWords(body.words);
            showLegend(body.branches);
          }
          draw(entry);
        } catch (err) {
          if (seq !== state.seq) return; // an older search's: its cards are gone
          const entry = state.cards.get(id);
          if (entry) entry.why.textContent = `no explanation: ${err.message}`;
        }
      }
    }
    await Promise.all(Array.from({ length: EXPLAIN_CONCURRENCY }, worker));
  }

  // ------------------------------------------------------------------ words
  function renderWords(words) {
    state.words = words;
    const bar = $("words");
    bar.replaceChildren();
    words.forEach((word, i) => {
      const chip = document.createElement("span");
      chip.className = word.special ? "word special" : "word";
      chip.dataset.index = String(i);
      chip.tabIndex = 0;
      chip.setAttribute("role", "button");
      chip.textContent = word.text;
      chip.addEventListener("mouseenter", () => setActiveWord(i));
      chip.addEventListener("mouseleave", () => setActiveWord(null));
      chip.addEventListener("focus", () => setActiveWord(i));
      chip.addEventListener("blur", () => setActiveWord(null));
      bar.append(chip);
    });
    $("words-bar").hidden = words.length === 0;
  }

  // The legend of what the explanations draw: the outlines only when patches are selected, the dense
  // caption's (orange) only when that branch is there (an index with the dense captions the model reads).
  function showLegend(branches) {
    $("legend-kept").hidden = branches.length === 0;
    $("legend-dense").hidden = !branches.some((b) => b.name === "dense");
    $("legend").hidden = false;
  }

  function setActiveWord(index) {
    state.activeWord = index;
    for (const chip of $("words").children) {
      chip.classList.toggle("active", index !== null && chip.dataset.index === String(index));
    }
    for (const entry of state.cards.values()) draw(entry);
  }

  // ------------------------------------------------------------------ drawing
  function cellRect(explain, r, c) {
    const [rows, cols] = explain.grid;
    const w = CANVAS / cols;
    const h = CANVAS / rows;
    return [c * w, r * h, w, h];
  }

  // Blue (cold) -> yellow -> red (hot) for v in [0, 1].
  function heatColour(v, alpha) {
    const r = Math.round(255 * Math.min(1, 2 * v));
    const g = Math.round(255 * (v < 0.5 ? 2 * v : 2 - 2 * v));
    const b = Math.round(255 * Math.max(0, 1 - 2 * v));
    return `rgba(${r}, ${g}, ${b}, ${alpha})`;
  }

  function drawKept(ctx, explain) {
    const [rows, cols] = explain.grid;
    const keptAny = (r, c) => explain.branches.some((b) => b.kept[r][c] === 1);
    ctx.fillStyle = "rgba(0, 0, 0, 0.5)";
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) if (!keptAny(r, c)) ctx.fillRect(...cellRect(explain, r, c));
    }
    const styles = [
      { colour: "rgba(21, 170, 191, 0.95)", dash: [], inset: 1.5 },
      { colour: "rgba(247, 103, 7, 0.95)", dash: [5, 4], inset: 4.5 },
    ];
    explain.branches.forEach((branch, i) => {
      const style = styles[Math.min(i, styles.length - 1)];
      ctx.strokeStyle = style.colour;
      ctx.setLineDash(style.dash);
      ctx.lineWidth = 2.5;
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) {
          if (branch.kept[r][c] !== 1) continue;
          const [x, y, w, h] = cellRect(explain, r, c);
          ctx.strokeRect(x + style.inset, y + style.inset, w - 2 * style.inset, h - 2 * style.inset);
        }
      }
    });
    ctx.setLineDash([]);
  }

  function drawHeat(ctx, explain, word) {
    const [rows, cols] = explain.grid;
    let top = 0;
    for (const row of word.heat) for (const v of row) top = Math.max(top, v);
    ctx.fillStyle = "rgba(0, 0, 0, 0.45)";
    ctx.fillRect(0, 0, CANVAS, CANVAS);
    if (top <= 0) return;
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const v = Math.max(0, word.heat[r][c]) / top;
        if (v <= 0) continue;
        ctx.fillStyle = heatColour(v, 0.25 + 0.6 * v);
        ctx.fillRect(...cellRect(explain, r, c));
      }
    }
  }

  function describe(explain, word) {
    if (!word) {
      const kept = explain.branches.map((b) => `${b.name} ${b.kept_count}`).join(", ");
      return kept ? `kept patches: ${kept} of ${explain.grid[0] * explain.grid[1]}` : "";
    }
    if (word.best_token === "cls") return `"${word.text}" matched the global (CLS) token: no patch map`;
    return `"${word.text}" → ${word.best_token} (cosine ${word.cosine.toFixed(3)})`;
  }

  function draw(entry) {
    const ctx = entry.canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.clearRect(0, 0, CANVAS, CANVAS);
    if (entry.image) ctx.drawImage(entry.image, 0, 0, CANVAS, CANVAS);
    const explain = entry.explain;
    if (!explain) return;
    const word = state.activeWord !== null ? explain.words[state.activeWord] : null;
    if (word) {
      drawHeat(ctx, explain, word);
      entry.canvas.dataset.heatWord = String(state.activeWord);
    } else {
      drawKept(ctx, explain);
      entry.canvas.dataset.heatWord = "";
    }
    entry.why.textContent = describe(explain, word);
  }

  // The bounds of k and of the query are the server's (serve --max-k, --max-query-chars), read once the
  // page loads.
  async function loadSettings() {
    try {
      const health = await getJSON("/healthz");
      state.maxK = health.max_k;
      state.defaultK = health.default_k;
      $("k").max = String(health.max_k);
      if (health.max_query_chars) $("q").maxLength = health.max_query_chars;
      if (!$("k").value) $("k").value = String(health.default_k);
    } catch (err) {
      setStatus(`cannot read the server's settings: ${err.message}`, true);
    }
  }

  // A page opened at ?q=...&k=... (a reload, a shared address) searches for it once the settings are in.
  async function start() {
    const asked = new URLSearchParams(location.search);
    if (asked.get("q")) $("q").value = asked.get("q");
    if (asked.get("k")) $("k").value = asked.get("k");
    await loadSettings();
    if (asked.get("q")) search();
  }

  $("search-form").addEventListener("submit", onSubmit);
  start();
})();
