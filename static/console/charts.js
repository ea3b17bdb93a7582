// The console's time-series charts, drawn with uPlot (static/vendor/uplot/).
// Workers page (#metric-charts): metric snapshots from metrics.json for one model over the last
// hour or day, refreshed every sampling interval. Usage page (#usage-chart): tokens per day and
// model, from the JSON the page embeds (#usage-series-data); and spend per day and currency
// (#spend-chart). Colours are the theme's tokens (--chart-1.., --chart-axis, --chart-grid in
// static/tokens.css), read when a chart is drawn; a change of theme ("pagoda:theme",
// static/theme.js) draws every chart again.
(function () {
  "use strict";
  const NUM_COLORS = 7;
  const HEIGHT = 220;
  const drawn = new Set();  // the chart elements, to draw again in the other theme

  // A token's colour as the canvas needs it: custom properties hold light-dark(...), so the
  // browser resolves it on a probe element.
  const probe = document.createElement("span");
  function token(name) {
    if (!probe.isConnected) { probe.hidden = true; document.body.appendChild(probe); }
    probe.style.color = `var(${name})`;
    return getComputedStyle(probe).color;
  }
  const seriesColor = (index) => token(`--chart-${(index % NUM_COLORS) + 1}`);
  function themed(opts) {
    const axis = token("--chart-axis"), grid = token("--chart-grid");
    const style = { stroke: axis, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    const axes = (opts.axes || [{}, {}]).map((a) => Object.assign({}, style, a));
    return Object.assign({}, opts, { axes });
  }

  const fixed = (digits) => (u, v) => (v === null || v === undefined ? "–" : v.toFixed(digits));
  const width = (el) => Math.max(300, el.clientWidth || 600);

  function lineSeries(label, index, valueDigits, dash) {
    return { label, colorIndex: index, width: 1.5, dash, value: fixed(valueDigits), points: { show: false } };
  }

  // Replace a chart: uPlot needs its series fixed at creation, and they differ by model and window.
  function draw(el, series, data, opts) {
    if (el._plot) el._plot.destroy();
    el.replaceChildren();
    el._drawn = [series, data, opts];
    drawn.add(el);
    const colored = series.map((s) => Object.assign({}, s, { stroke: seriesColor(s.colorIndex) }));
    el._plot = new uPlot(themed(Object.assign({ width: width(el), height: HEIGHT, series: [{}].concat(colored),
                                                legend: { live: true } }, opts || {})), data, el);
  }
  window.addEventListener("pagoda:theme", () => drawn.forEach((el) => { if (el._plot) draw(el, ...el._drawn); }));

  // Buckets without samples become a null point, so uPlot draws a gap instead of a straight line.
  function withGaps(model, bucketS, fields) {
    const t = [], cols = fields.map(() => []);
    model.t.forEach((start, i) => {
      if (i > 0 && start - model.t[i - 1] > 2 * bucketS) {
        t.push(model.t[i - 1] + bucketS);
        cols.forEach((col) => col.push(null));
      }
      t.push(start);
      fields.forEach((f, k) => cols[k].push(f(i)));
    });
    return [t].concat(cols);
  }

  function metricCharts(section) {
    const charts = {};
    section.querySelectorAll("[data-chart]").forEach((el) => { charts[el.dataset.chart] = el; });
    const select = document.getElementById("chart-model");
    const empty = document.getElementById("charts-empty");
    const stamp = document.getElementById("charts-refreshed");
    const buttons = section.querySelectorAll("#chart-window button");
    const modelField = document.getElementById("chart-model-field");  // hidden until a model has samples
    let win = "1h", timer = null;

    function render(data) {
      const slugs = data.model_slugs, asked = select.value;
      select.replaceChildren(...slugs.map((slug) => new Option(slug, slug)));
      modelField.hidden = slugs.length === 0;
      const slug = slugs.includes(asked) ? asked : slugs[0];
      if (slug === undefined) select.value = "";
      else select.value = slug;
      if (slug !== undefined && !data.models[slug]) return "refetch";  // asked for a model now gone
      const model = data.models[slug];
      const hasData = Boolean(model && model.t.length);
      empty.hidden = hasData;
      section.querySelector(".charts").hidden = !hasData;
      if (!hasData) return;
      const m = model, b = data.bucket_s;
      const pct = (v) => (v === null ? null : v * 100);
      draw(charts.tokens, [lineSeries("tokens/s", 0, 1)], withGaps(m, b, [(i) => m.tokens_per_s[i]]));
      draw(charts.kv, [lineSeries("mean", 0, 1), lineSeries("max", 1, 1, [4, 3])],
           withGaps(m, b, [(i) => pct(m.kv_mean[i]), (i) => pct(m.kv_max[i])]), { scales: { y: { range: [0, 100] } } });
      draw(charts.queue, [lineSeries("running", 0, 1), lineSeries("waiting", 1, 1),
                          lineSeries("running + waiting", 6, 1, [4, 3])],
           withGaps(m, b, [(i) => m.num_running[i], (i) => m.num_waiting[i],
                           (i) => m.num_running[i] + m.num_waiting[i]]));
      draw(charts.latency, [lineSeries("TTFT p50", 0, 3), lineSeries("TTFT p95", 0, 3, [4, 3]),
                            lineSeries("ITL p50", 1, 3), lineSeries("ITL p95", 1, 3, [4, 3])],
           withGaps(m, b, [(i) => m.ttft_p50[i], (i) => m.ttft_p95[i], (i) => m.itl_p50[i], (i) => m.itl_p95[i]]));
    }

    async function refresh() {
      const url = new URL(section.dataset.url, window.location.href);
      url.searchParams.set("window", win);
      if (select.value) url.searchParams.set("model", select.value);
      let delayS = 10;
      try {
        const response = await fetch(url, { headers: { Accept: "application/json" } });
        if (!response.ok) throw new Error(String(response.status));
        const data = await response.json();
        if (render(data) === "refetch") return refresh();
        delayS = Math.max(data.interval_s, win === "1d" ? 60 : data.interval_s);
        stamp.textContent = "updated " + new Date().toLocaleTimeString();
      } catch (err) {
        stamp.textContent = "refresh failed (" + err.message + ")";
      }
      clearTimeout(timer);
      timer = setTimeout(refresh, delayS * 1000);
    }

    buttons.forEach((button) => button.addEventListener("click", () => {
      win = button.dataset.window;
      buttons.forEach((other) => other.classList.toggle("current", other === button));
      refresh();
    }));
    select.addEventListener("change", refresh);
    window.addEventListener("resize", () => Object.values(charts).forEach((el) => {
      if (el._plot) el._plot.setSize({ width: width(el), height: HEIGHT });
    }));
    refresh();
  }

  function usageChart(el, data, digits) {
    const t = data.days.map((day) => Date.parse(day + "T00:00:00Z") / 1000);
    const names = Object.keys(data.models);
    const total = t.map((_, i) => names.reduce((sum, name) => sum + data.models[name][i], 0));
    const series = names.map((name, k) => Object.assign(lineSeries(name, k, digits), { points: { show: true } }));
    if (digits === 0) series.push(lineSeries("total", 6, 0, [4, 3]));  // currencies do not add up
    const DAY = 86400;
    draw(el, series, [t].concat(names.map((name) => data.models[name]), digits === 0 ? [total] : []), {
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),  // the days are UTC days
      // Tokens: at least 0..1; money: its own scale (a day may cost 0.0015).
      scales: { y: { range: (u, min, max) => [0, (digits === 0 ? Math.max(1, max) : max || 1) * 1.05] } },
      axes: [{ incrs: [DAY, 2 * DAY, 7 * DAY, 14 * DAY, 30 * DAY, 91 * DAY, 365 * DAY],
               values: (u, splits) => splits.map((ts) => new Date(ts * 1000).toISOString().slice(5, 10)) },
             digits === 0 ? {} : { size: 70, values: (u, splits) => splits.map((v) => String(+v.toPrecision(3))) }],
    });
    window.addEventListener("resize", () => el._plot.setSize({ width: width(el), height: HEIGHT }));
  }

  const section = document.getElementById("metric-charts");
  if (section) metricCharts(section);
  const usage = document.getElementById("usage-chart");
  if (usage) usageChart(usage, JSON.parse(document.getElementById("usage-series-data").textContent), 0);
  const spend = document.getElementById("spend-chart");  // money per day and currency
  if (spend) usageChart(spend, JSON.parse(document.getElementById("spend-series-data").textContent), 4);
})();
