// The operator's path through `claimtx console` in a real browser: the
// overview, a key lookup, the dead letters, a dry-run preview and a replay
// job, then the replayed order's claim. Run by framework/cmd/claimtx/internal/console/browser_test.go
// (go test -tags browser), which starts the console against seeded data and
// passes what to look for in the environment:
//
//   CONSOLE_URL       the console, e.g. http://127.0.0.1:7070
//   CONSOLE_CONSUMER  the consumer to look at
//   CONSOLE_TOKEN     when set, the console wants it: sign in through /login
//   LOOKUP_KEY        a key the consumer applied
//   MISSING_KEY       a key it never saw
//   REPLAY_KEY        the key of the would-apply dead letter to replay
//   PARKED_KEY        an order key of the consumer parked with two messages
//   EXPECT_LETTERS    JSON [{key, class, text}]: the letters the page must show
//   SCREENSHOT_DIR    where the screenshots go (full page, 1280 wide)
//   FAILURE_DIR       where the page is saved when a step fails
//
// Steps run in order and share one page; after a failed step the rest are
// skipped, and the page at the failure is saved as FAILURE_DIR/<step>.png.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { launch } from './browser.mjs';

function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (run through go test -tags browser ./framework/cmd/claimtx/internal/console/)`);
  return v;
}

const base = required('CONSOLE_URL');
const consumer = required('CONSOLE_CONSUMER');
const token = process.env.CONSOLE_TOKEN || '';
const lookupKey = required('LOOKUP_KEY');
const missingKey = required('MISSING_KEY');
const replayKey = required('REPLAY_KEY');
const parkedKey = required('PARKED_KEY');
const letters = JSON.parse(required('EXPECT_LETTERS'));
const shots = required('SCREENSHOT_DIR');
const failures = required('FAILURE_DIR');

// Bounds, not pauses: every wait below ends as soon as its condition holds.
const STEP_TIMEOUT = 15_000;
const CLAIM_TIMEOUT = 30_000;

let browser;
let page;
let failed = '';
const scripts = [];

// step is one it() of the scenario: skipped once an earlier one failed.
function step(name, fn) {
  it(name, async (t) => {
    if (failed) {
      t.skip(`after the failed step "${failed}"`);
      return;
    }
    try {
      await fn();
    } catch (err) {
      failed = name;
      const file = path.join(failures, `${name.replace(/\W+/g, '-')}.png`);
      await mkdir(failures, { recursive: true });
      await page?.screenshot({ path: file, fullPage: true }).catch(() => {});
      t.diagnostic(`page ${page?.url()} saved to ${file}`);
      throw err;
    }
  });
}

async function shot(name) {
  await page.screenshot({ path: path.join(shots, name), fullPage: true });
}

// exactText matches an element whose whole text is s (surrounding blanks
// aside).
function exactText(s) {
  return new RegExp(`^\\s*${literally(s).source}\\s*$`);
}

// waitText waits until one of locator's elements has the text: a string
// is the whole text, a RegExp matches anywhere.
async function waitText(locator, text) {
  await locator.filter({ hasText: typeof text === 'string' ? exactText(text) : text }).first().waitFor();
}

function literally(s) {
  return new RegExp(s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
}

// row is the row of table (a CSS selector) whose key cell holds key.
function row(table, key) {
  return page.locator(`${table} tr[data-id]`).filter({
    has: page.locator('td.key', { hasText: exactText(key) }),
  });
}

function lookupURL(key) {
  return `${base}/lookup?consumer=${encodeURIComponent(consumer)}&key=${encodeURIComponent(key)}`;
}

describe('claimtx console', { concurrency: 1 }, () => {
  before(async () => {
    browser = await launch();
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
    page.setDefaultTimeout(STEP_TIMEOUT);
    page.setDefaultNavigationTimeout(STEP_TIMEOUT);
    // The pages have no JavaScript: a dialog or a script error means
    // producer data (a key, a reason) got into the page as markup.
    page.on('dialog', async (d) => {
      scripts.push(`dialog: ${d.message()}`);
      await d.dismiss();
    });
    page.on('pageerror', (err) => scripts.push(`page error: ${err.message}`));
  });

  after(async () => {
    await browser?.close();
  });

  if (token) {
    step('sign in', async () => {
      // A page asked for before signing in is where the sign-in leads.
      await page.goto(lookupURL(lookupKey));
      await page.getByRole('heading', { level: 1, name: 'Sign in', exact: true }).waitFor();
      assert.match(new URL(page.url()).pathname, /^\/login/);
      await page.locator('input[name="token"]').fill('not-the-token-at-all');
      await page.getByRole('button', { name: 'Sign in', exact: true }).click();
      await page.locator('#error').waitFor();
      await page.getByRole('heading', { level: 1, name: 'Sign in', exact: true }).waitFor();
      await page.locator('input[name="token"]').fill(token);
      await page.getByRole('button', { name: 'Sign in', exact: true }).click();
      await page.getByRole('heading', { level: 1, name: 'Look up a key', exact: true }).waitFor();
      await page.locator('#claim').waitFor();
    });
  }

  step('overview', async () => {
    await page.goto(`${base}/`);
    await page.getByRole('heading', { level: 1, name: 'Overview', exact: true }).waitFor();
    const row = page.locator(`#consumers tr[data-consumer="${consumer}"]`);
    await row.waitFor();
    await row.locator('svg').first().waitFor();
    await shot('console-overview.png');
  });

  step('look up an applied key', async () => {
    await page.getByRole('link', { name: 'Look up', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Look up a key', exact: true }).waitFor();
    const form = page.locator('form').filter({ has: page.getByRole('button', { name: 'Look up', exact: true }) });
    await form.locator('select[name="consumer"]').selectOption(consumer);
    await form.locator('input[name="key"]').fill(lookupKey);
    await form.getByRole('button', { name: 'Look up', exact: true }).click();
    const report = page.locator('#report');
    await report.waitFor();
    await waitText(report, literally(lookupKey));
    await page.locator('#claim').waitFor();
    assert.equal(await report.getByText(/No claim/).count(), 0, 'the applied key has a claim');
    await shot('console-lookup.png');
  });

  step('look up a key never applied', async () => {
    const form = page.locator('form').filter({ has: page.getByRole('button', { name: 'Look up', exact: true }) });
    await form.locator('select[name="consumer"]').selectOption(consumer);
    await form.locator('input[name="key"]').fill(missingKey);
    await form.getByRole('button', { name: 'Look up', exact: true }).click();
    await page.locator('#report').getByText(/No claim/).waitFor();
    assert.equal(await page.locator('#claim').count(), 0);
  });

  step('dead letters', async () => {
    await page.getByRole('link', { name: 'Dead letters', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Dead letters', exact: true }).waitFor();
    await page.locator('#filters select[name="consumer"]').selectOption(consumer);
    await page.locator('#filters').getByRole('button', { name: 'Filter', exact: true }).click();
    await page.waitForURL((u) => u.searchParams.get('consumer') === consumer);
    const rows = page.locator('#letters tr[data-id]');
    await rows.first().waitFor();
    assert.equal(await rows.count(), letters.length, 'one row per seeded letter');
    for (const l of letters) {
      if (!l.key) continue;
      const r = row('#letters', l.key);
      assert.equal(await r.count(), 1, `one row with key ${l.key}`);
      const cls = r.locator('td[data-class]');
      assert.equal(await cls.getAttribute('data-class'), l.class, `class of ${l.key}`);
      assert.match(await cls.textContent(), exactText(l.text), `class text of ${l.key}`);
    }
    for (const cls of new Set(letters.filter((l) => !l.key).map((l) => l.class))) {
      const want = letters.filter((l) => l.class === cls).length;
      const got = page.locator(`#letters td[data-class="${cls}"]`);
      assert.equal(await got.count(), want, `${cls} letters`);
      assert.match(await got.first().textContent(), exactText(letters.find((l) => l.class === cls).text));
    }
    // Keys, reasons and payloads are producer data: shown as text, never
    // as markup.
    assert.equal(await page.locator('#letters img').count(), 0, 'no markup from a key or a payload');
    assert.deepEqual(scripts, [], 'no script ran');
    await shot('console-dead-letters.png');
  });

  step('preview the replay of the would-apply letter', async () => {
    await row('#letters', replayKey).locator('input[type="checkbox"][name="id"]').check();
    await page.getByRole('button', { name: 'Preview replay of selected', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Replay preview', exact: true }).waitFor();
    const rows = page.locator('#preview tr[data-id]');
    await rows.first().waitFor();
    assert.equal(await rows.count(), 1, 'only the selected letter');
    const previewed = row('#preview', replayKey);
    assert.equal(await previewed.count(), 1, `the preview shows ${replayKey}`);
    assert.equal(await previewed.locator('td[data-class]').getAttribute('data-class'), 'would-apply');
    assert.equal(await previewed.locator('td[data-action]').getAttribute('data-action'), 'replay');
    await waitText(previewed.locator('td[data-action]'), /^\s*replay/);
    await shot('console-preview.png');
  });

  step('replay it', async () => {
    await page.getByRole('button', { name: /^Replay 1 letter/ }).click();
    await page.getByRole('heading', { level: 1, name: 'Replay', exact: true }).waitFor();
    assert.match(new URL(page.url()).pathname, /^\/jobs\/./);
    // The page refreshes itself while the job runs.
    await waitText(page.locator('#job-status'), 'done');
    const replayed = row('#results', replayKey);
    await replayed.waitFor();
    assert.equal(await replayed.locator('td[data-result]').getAttribute('data-result'), 'replayed');
    await waitText(replayed.locator('td[data-result]'), 'replayed');
    await shot('console-replay.png');
  });

  step('the replayed order is applied', async () => {
    // The consumer applies the republished copy on its own time: reload
    // the lookup until the claim is there, within CLAIM_TIMEOUT.
    const deadline = Date.now() + CLAIM_TIMEOUT;
    for (;;) {
      await page.goto(lookupURL(replayKey));
      await page.locator('#report').waitFor();
      if (await page.locator('#claim').count() > 0) break;
      assert.ok(Date.now() < deadline, `no claim for ${replayKey} within ${CLAIM_TIMEOUT} ms`);
    }
    await waitText(page.locator('#report'), literally(replayKey));
    assert.deepEqual(scripts, [], 'no page ran a script');
  });

  step('preview all matching letters: a dry-run job', async () => {
    await page.goto(`${base}/dead-letters?consumer=${encodeURIComponent(consumer)}`);
    await page.locator('#letters tr[data-id]').first().waitFor();
    await page.getByRole('button', { name: 'Preview replay of all matching', exact: true }).click();
    // The dry run reads the whole queue in the background: the page is the
    // job's, reloading itself until it is done.
    await page.getByRole('heading', { level: 1, name: 'Replay preview', exact: true }).waitFor();
    assert.match(new URL(page.url()).pathname, /^\/jobs\/./);
    await waitText(page.locator('#job-status'), 'done');
    const rows = page.locator('#preview tr[data-id]');
    await rows.first().waitFor();
    assert.equal(await rows.count(), letters.length - 1, 'every letter left, the replayed one gone');
    assert.equal(await row('#preview', replayKey).count(), 0, `${replayKey} left the poison queue`);
    const wouldApply = letters.filter((l) => l.class === 'would-apply').length - 1;
    assert.equal(await page.locator('#preview td[data-action="replay"]').count(), wouldApply, 'the would-apply letters left');
    // A dry run changes nothing; its confirmation replays what it showed.
    await page.getByRole('button', { name: new RegExp(`^Replay ${wouldApply} letter`) }).waitFor();
    assert.deepEqual(scripts, [], 'no page ran a script');
  });
  step('parked keys: the sequence, then a retry request', async () => {
    await page.goto(`${base}/`);
    await page.locator('.parked-summary').first().waitFor();
    await page.getByRole('link', { name: 'Parked', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Parked order keys', exact: true }).waitFor();
    await page.getByRole('link', { name: parkedKey, exact: true }).click();
    const rows = page.locator('#parked-messages tr[data-id]');
    await rows.first().waitFor();
    assert.equal(await rows.count(), 2, 'the head and the message behind it');
    await waitText(rows.first().locator('.badge'), 'head');
    await waitText(rows.nth(1).locator('span.muted'), 'behind the head');
    await shot('console-parked.png');
    await page.getByRole('button', { name: 'Retry', exact: true }).click();
    await page.locator('#done', { hasText: 'Requested a retry' }).waitFor({ timeout: STEP_TIMEOUT });
    await waitText(page.locator('#release'), 'retry requested by console');
    // A skip needs its note: the browser refuses the empty form.
    await page.getByRole('button', { name: 'Skip the head', exact: true }).click();
    assert.equal(await page.locator('#done').count(), 1, 'still the retry notice: the skip was not sent');
    assert.deepEqual(scripts, [], 'no page ran a script');
  });
});
