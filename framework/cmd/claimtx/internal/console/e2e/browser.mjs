// The one way these tests start a browser: Debian's Chromium (CHROMIUM_PATH
// or /usr/bin/chromium), headless, with every flag that makes it reach for
// the network on its own turned off. The machines running these tests reach
// only package registries: Chromium's background requests (component
// updates, sync, safe browsing) would be refused, many at a time, and slow
// or disturb the pages under test. launch() gives each run a fresh, empty
// profile (--user-data-dir in a temporary folder).
import { chromium } from 'playwright-core';

export const chromiumPath = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

export function launch() {
  return chromium.launch({
    executablePath: chromiumPath,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
