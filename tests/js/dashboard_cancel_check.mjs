// Loads the Minions web dashboard in headless Chromium, signed in as a person would, opens one
// running job's page, cancels it with the page's button (clicked twice: the second click
// confirms) and downloads what it finished through the page's links. Used by
// tests/integration/observability_test.cc.
//
//   MINIONS_DASHBOARD_TOKEN=mnv_... node --experimental-websocket dashboard_cancel_check.mjs URL JOB [TIMEOUT_SECONDS]
//
// Prints one JSON line and exits 0:
//   {"before":{"cancel":B,"download":B},  the job page's actions while it runs
//    "message":M,"summary":S,             what the page said after the cancel
//    "output":{"status":N,"disposition":D,"lines":[custom_id...]},  the "Download results" link
//    "errors":{"status":N,"lines":[{"custom_id","code"}]}}          the "Download errors" link
// or exits 1 on a timeout or an error.
import { emit, fromCommandLine } from "./chromium_page.mjs";

const { args: [url, jobId], browser } = fromCommandLine("dashboard_cancel_check.mjs", ["URL", "JOB"]);

async function main() {
  const cdp = await browser.signedInPage(url);
  await browser.openJob(cdp, jobId, `!!document.getElementById("job-cancel")`, "the job's page with its cancel button");
  const before = await cdp.eval(`({ cancel: !!document.getElementById("job-cancel"),
                                    download: !!document.getElementById("job-download") })`);
  // The first click asks to confirm; the second cancels.
  await cdp.eval(`document.getElementById("job-cancel").click(); true`);
  await browser.until(cdp, `document.getElementById("job-cancel").textContent.startsWith("Yes")`, "the confirmation");
  await cdp.eval(`document.getElementById("job-cancel").click(); true`);
  await browser.until(cdp, `document.getElementById("job-summary").textContent.startsWith("cancelled") &&
                            !!document.getElementById("job-download")`, "the cancelled job's download links");
  const message = await cdp.eval(`(document.querySelector("#job-actions .action-message") || {}).textContent || ""`);
  const summary = await cdp.eval(`document.getElementById("job-summary").textContent`);
  // The links as the page has them, fetched as the browser follows them (with its session).
  const download = (id) => cdp.eval(`(async () => {
    const res = await fetch(document.getElementById(${JSON.stringify(id)}).href, { credentials: "same-origin" });
    const text = await res.text();
    return { status: res.status, disposition: res.headers.get("content-disposition"),
             lines: text.split("\\n").filter((l) => l).map((l) => JSON.parse(l)) };
  })()`);
  const output = await download("job-download");
  const errors = await download("job-download-errors");
  emit({
    before, message, summary,
    output: { status: output.status, disposition: output.disposition, lines: output.lines.map((l) => l.custom_id) },
    errors: { status: errors.status, lines: errors.lines.map((l) => ({ custom_id: l.custom_id,
      code: (l.error && l.error.code) || (l.response && l.response.body && l.response.body.error && l.response.body.error.code) || "" })) },
  });
}

main().then(() => { browser.close(); process.exit(0); },
  (err) => { console.error(String(err.stack || err)); browser.close(); process.exit(1); });
