// Loads the Minions web dashboard in headless Chromium, signed in as a person would, opens one
// job's page and reports what the page drew: the rate chart's data as uPlot holds it, every job
// row of the jobs table and the job's errors. Used by tests/integration/dashboard_history_test.cc.
//
//   MINIONS_DASHBOARD_TOKEN=mnv_... node --experimental-websocket dashboard_history_check.mjs URL JOB SCREENSHOT.png [TIMEOUT_SECONDS]
//
// Prints one JSON line and exits 0:
//   {"t":[unix seconds],"rates":[the job's records/s, null where none],"series":[labels],
//    "rows":[{"job","state","bar":class,"rate","eta"}],"summary":S,"record_errors":{"failed":N,
//    "lines":[texts],"all":command},"points":P}
// or exits 1 on a timeout or an error.
import { emit, fromCommandLine } from "./chromium_page.mjs";

const { args: [url, jobId, screenshotPath], browser } =
  fromCommandLine("dashboard_history_check.mjs", ["URL", "JOB", "SCREENSHOT.png"]);

async function main() {
  const cdp = await browser.signedInPage(url);
  await browser.openJob(cdp, jobId, `document.getElementById("job-errors").children.length > 0`);
  // The rate chart drawn with the job among its series (charts: app.js's chart registry).
  const drawn = `(() => {
    const c = typeof charts !== "undefined" && charts["chart-rates"];
    if (!c || !document.querySelector("#chart-rates .uplot canvas")) return null;
    const labels = c.plot.series.slice(1).map((s) => s.label);
    const i = labels.indexOf(${JSON.stringify(jobId)});
    if (i < 0) return null;
    return { t: Array.from(c.plot.data[0]), rates: Array.from(c.plot.data[i + 1]), series: labels };
  })()`;
  const chart = await browser.until(cdp, drawn, "the rate chart with the job");
  await browser.screenshot(cdp, screenshotPath);
  const rows = await cdp.eval(`[...document.querySelectorAll("#jobs tbody tr[data-job]")].map((tr) => ({
    job: tr.dataset.job, state: tr.children[2].textContent, bar: tr.querySelector(".bar").className,
    rate: tr.querySelector("td.rate").textContent, eta: tr.querySelector("td.eta").textContent }))`);
  const errors = await cdp.eval(`(() => {
    const li = document.querySelector("#job-errors .record-errors");
    if (!li) return { failed: 0, lines: [], all: "" };
    return { failed: Number(li.dataset.failed), lines: [...li.querySelectorAll("li")].map((e) => e.textContent),
             all: li.querySelector("code").textContent };
  })()`);
  emit({ ...chart, rows, summary: await cdp.eval(`document.getElementById("job-summary").textContent`),
         record_errors: errors, points: Number(await cdp.eval(`document.body.dataset.chartPoints || 0`)) });
}

main().then(() => { browser.close(); process.exit(0); },
  (err) => { console.error(String(err.stack || err)); browser.close(); process.exit(1); });
