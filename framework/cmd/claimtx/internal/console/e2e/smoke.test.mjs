// The browser works at all: Chromium starts, renders a page and takes a
// screenshot. No console needed (`node --test smoke.test.mjs`), so a broken
// Chromium install is told apart from a broken console.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launch } from './browser.mjs';

test('chromium renders a data: URL', async () => {
  const browser = await launch();
  try {
    const page = await browser.newPage();
    await page.goto('data:text/html,<title>smoke</title><h1>claimtx</h1><button onclick="this.textContent=\'clicked\'">click</button>');
    await page.getByRole('button', { name: 'click' }).click();
    assert.equal(await page.getByRole('button').textContent(), 'clicked');
    assert.equal(await page.getByRole('heading', { level: 1 }).textContent(), 'claimtx');
    const png = await page.screenshot();
    assert.ok(png.subarray(1, 4).toString() === 'PNG', 'a PNG screenshot');
  } finally {
    await browser.close();
  }
});
