// run_checks.mjs - the test scripts' runner: every named check runs (async),
// one "ok NAME" / "FAIL NAME: stack" line each; the process exits 1 if any failed.
export async function runChecks(checks) {
  let failed = 0;
  for (const [name, fn] of Object.entries(checks)) {
    try {
      await fn();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e.stack}`);
    }
  }
  process.exit(failed ? 1 : 0);
}
