// Drives the splash chat page in headless Chromium (Debian's /usr/bin/chromium) with
// playwright-core. Run by crates/splash-cli/tests/webui.rs, which starts the servers:
//
//   SPLASH_URL        a `splash serve --model demo` without a key
//   SPLASH_KEYED_URL  the same with --api-key $SPLASH_KEY
//   SPLASH_VISION_URL a `splash serve` of a model that takes images
//   SPLASH_SCREENSHOT where to save the screenshot (default ../../target/webui-screenshot.png)
//   CHROMIUM          the browser (default /usr/bin/chromium)
//
// By hand: node tests/webui/chat.spec.mjs (with the variables above set).
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { deflateSync } from 'node:zlib';

const here = dirname(fileURLToPath(import.meta.url));
const URL_ = need('SPLASH_URL');
const KEYED_URL = need('SPLASH_KEYED_URL');
const KEY = need('SPLASH_KEY');
const VISION_URL = need('SPLASH_VISION_URL');
const SHOT = process.env.SPLASH_SCREENSHOT || resolve(here, '../../target/webui-screenshot.png');
const BROWSER = process.env.CHROMIUM || '/usr/bin/chromium';

const MARKDOWN_ANSWER = `Use a **\`BufReader\`** and its \`lines()\` iterator: it reads in chunks, so large files are fine.

\`\`\`rust
use std::fs::File;
use std::io::{self, BufRead, BufReader};

fn main() -> io::Result<()> {
    let file = File::open("notes.txt")?;
    for (n, line) in BufReader::new(file).lines().enumerate() {
        println!("{:>4}: {}", n + 1, line?); // each line without its newline
    }
    Ok(())
}
\`\`\`

| approach | memory | when |
|---|---|---|
| \`read_to_string\` | whole file | small files |
| \`BufReader::lines\` | one line | large files, streaming |

1. Open the file with \`File::open\`.
2. Wrap it in a \`BufReader\`.
3. Handle each \`io::Result<String>\` with \`?\`.

> Tip: for *binary* data, use \`read_until\` or \`Read::read\` instead.`;

// A 96×64 RGB PNG: channel c of pixel (y, x) is (7y + 13x + 50c) % 256.
// A one-page PDF of 12-point Helvetica lines (a standard font, not embedded).
function textPdf(lines) {
  const stream = `BT /F1 12 Tf 72 720 Td 14 TL\n${lines.map((l) => `(${l}) Tj T*\n`).join('')}ET\n`;
  const objects = [
    '<< /Type /Catalog /Pages 2 0 R >>',
    '<< /Type /Pages /Kids [5 0 R] /Count 1 >>',
    '<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>',
    `<< /Length ${stream.length} >>\nstream\n${stream}endstream`,
    '<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>',
  ];
  let out = '%PDF-1.4\n';
  const offsets = objects.map((o, i) => {
    const at = out.length;
    out += `${i + 1} 0 obj\n${o}\nendobj\n`;
    return at;
  });
  const xref = out.length;
  out += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n`;
  out += offsets.map((o) => `${String(o).padStart(10, '0')} 00000 n \n`).join('');
  out += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, 'latin1');
}

function patternPng(w, h) {
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) {
    raw[y * (1 + 3 * w)] = 0;
    for (let x = 0; x < w; x++)
      for (let c = 0; c < 3; c++) raw[y * (1 + 3 * w) + 1 + 3 * x + c] = (7 * y + 13 * x + 50 * c) % 256;
  }
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    for (let k = 0; k < 8; k++) n = n & 1 ? 0xedb88320 ^ (n >>> 1) : n >>> 1;
    return n >>> 0;
  });
  const crc = (buf) => {
    let c = 0xffffffff;
    for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const head = Buffer.alloc(4);
    head.writeUInt32BE(data.length);
    const body = Buffer.concat([Buffer.from(type), data]);
    const tail = Buffer.alloc(4);
    tail.writeUInt32BE(crc(body));
    return Buffer.concat([head, body, tail]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(raw)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

function need(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (see the header of this file)`);
  return v;
}

let step = '';
function log(s) {
  step = s;
  console.log(`- ${s}`);
}
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const profile = mkdtempSync(join(tmpdir(), 'splash-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: BROWSER,
  headless: true,
  viewport: { width: 1280, height: 820 },
  deviceScaleFactor: 1,
  colorScheme: 'light',
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});

const problems = [];
function watch(page) {
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // Failed requests the test provokes on purpose (401, 503, refused) are logged by Chromium.
    if (m.type() === 'error' && !/Failed to load resource|net::ERR_/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
}

const lastAssistant = '.msg.assistant:last-of-type';

// Sends `text` and waits until the answer is complete; returns what streaming looked like.
async function ask(page, text) {
  await page.evaluate(() => {
    // Record the length of the last assistant message at every DOM change: a streamed answer
    // grows in many steps, a buffered one appears at once.
    window.__lengths = [];
    const box = document.getElementById('messages');
    window.__observer && window.__observer.disconnect();
    window.__observer = new MutationObserver(() => {
      const all = box.querySelectorAll('.msg.assistant .msg-body');
      const last = all[all.length - 1];
      if (last) window.__lengths.push(last.textContent.length);
    });
    window.__observer.observe(box, { childList: true, subtree: true, characterData: true });
  });
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
  await page.waitForSelector('#stop:not([hidden])', { timeout: 10000 }).catch(() => {});
  await page.waitForSelector('#send:not([hidden])', { timeout: 60000 });
  return page.evaluate(() => window.__lengths);
}

function grewInSteps(lengths) {
  const distinct = [...new Set(lengths.filter((n) => n > 0))];
  return distinct.length >= 3;
}

// Fills a field in the Settings section of the sidebar (opening it first).
async function setting(page, selector, value) {
  if (!(await page.$eval('#settings', (d) => d.open))) await page.click('#settings summary');
  await page.fill(selector, value);
}

async function chatTitles(page) {
  return page.$$eval('.chat-item .chat-title', (els) => els.map((e) => e.textContent));
}

async function serverStatus(url, key) {
  const res = await fetch(new URL('/status', url), { headers: key ? { Authorization: `Bearer ${key}` } : {} });
  return res.json();
}

try {
  const page = await context.newPage();
  watch(page);

  log('the page loads with the model name and no errors');
  await page.goto(URL_);
  await page.waitForSelector('.empty h1');
  check((await page.title()) === 'splash', 'title');
  check((await page.textContent('#model-name')) === (await serverStatus(URL_)).model, 'model name shown');
  check(/context/.test(await page.textContent('#model-ctx')), 'context shown');
  check(await page.isHidden('#attach'), 'no image attachment for a text-only model');

  log('the markdown renderer escapes HTML and highlights code');
  const rendered = await page.evaluate(() =>
    window.SplashMarkdown.render('**b** <img src=x onerror=alert(1)> [x](javascript:alert(1))\n\n```js\nconst a = "s"; // c\n```')
  );
  check(rendered.includes('<strong>b</strong>'), 'bold');
  check(!rendered.includes('<img') && rendered.includes('&lt;img'), 'HTML escaped');
  check(!rendered.includes('javascript:'), 'unsafe link dropped');
  check(rendered.includes('<span class="hl-k">const</span>') && rendered.includes('hl-c'), 'highlighted');

  log('send a message and see the answer stream in (reasoning on)');
  await setting(page, '#max-tokens', '160');
  const first = await ask(page, 'Hello! What can you do?');
  check(grewInSteps(first), `streamed in steps (lengths seen: ${first.slice(0, 12)})`);
  check((await page.textContent(`${lastAssistant} .reasoning-body`)).length > 0, 'reasoning shown');
  check(await page.isVisible(`${lastAssistant} .reasoning summary`), 'reasoning section has a toggle');
  const stats = await page.textContent(`${lastAssistant} .stats`);
  check(/\d+ tokens · [\d.]+ tok\/s · TTFT/.test(stats), `stats readout: ${stats}`);

  log('the reasoning section collapses and opens');
  const wasOpen = await page.$eval(`${lastAssistant} details.reasoning`, (d) => d.open);
  await page.click(`${lastAssistant} .reasoning summary`);
  check((await page.$eval(`${lastAssistant} details.reasoning`, (d) => d.open)) !== wasOpen, 'toggled');

  log('a second turn with thinking off answers in the content');
  await page.selectOption('#effort', 'none');
  await setting(page, '#max-tokens', '90');
  const second = await ask(page, 'Write a short poem about rain.');
  check(grewInSteps(second), 'second answer streamed');
  check((await page.textContent(`${lastAssistant} .content`)).trim().length > 0, 'answer text shown');
  check((await page.$$(`${lastAssistant} .reasoning`)).length === 0, 'no reasoning with thinking off');
  check((await page.$$('.msg')).length === 4, 'two turns shown');

  log('a second chat');
  await page.click('#new-chat');
  await page.waitForSelector('.empty');
  await page.selectOption('#effort', '');
  await setting(page, '#max-tokens', '60');
  await ask(page, 'Plan a weekend trip to the mountains');
  let titles = await chatTitles(page);
  check(titles.length === 2, `two chats listed: ${titles}`);
  check(titles[0].startsWith('Plan a weekend'), 'newest chat first');

  log('switch back to the first chat');
  await page.click('.chat-item:has-text("Hello! What can you do?") .chat-open');
  await page.waitForSelector('.msg.user:has-text("Write a short poem about rain.")');
  check((await page.$$('.msg')).length === 4, 'first chat has its four messages');
  check(await page.$eval('.chat-item.active .chat-title', (e) => e.textContent.startsWith('Hello!')), 'first chat active');

  log('reload and find both chats again');
  await page.reload();
  await page.waitForSelector('.chat-item');
  titles = await chatTitles(page);
  check(titles.length === 2, `both chats after reload: ${titles}`);
  check(await page.isVisible('.msg.user:has-text("Hello! What can you do?")'), 'open chat restored');
  await page.click('.chat-item:has-text("Plan a weekend") .chat-open');
  await page.waitForSelector('.msg.user:has-text("Plan a weekend trip")');
  check((await page.inputValue('#max-tokens')) === '60', 'settings kept across reloads');

  log('stop a long generation');
  await page.click('#new-chat');
  await setting(page, '#max-tokens', '200000');
  await page.fill('#prompt', 'Tell me a very long story.');
  await page.press('#prompt', 'Enter');
  await page.waitForSelector('#stop:not([hidden])');
  await page.waitForFunction(
    () => {
      const b = document.querySelectorAll('.msg.assistant .msg-body');
      return b.length && b[b.length - 1].textContent.length > 200;
    },
    null,
    { timeout: 30000 }
  );
  await page.click('#stop');
  await page.waitForSelector('#send:not([hidden])', { timeout: 5000 });
  await page.waitForSelector(`${lastAssistant} .tag:has-text("Stopped")`);
  const stoppedAt = (await page.textContent(`${lastAssistant} .reasoning-body`)).length;
  // The server cancels the generation when the stream is dropped.
  let running = -1;
  for (let i = 0; i < 50; i++) {
    const s = await serverStatus(URL_);
    running = s.queue.running + s.queue.waiting;
    if (running === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(running === 0, 'the server stopped generating');
  await page.waitForTimeout(400);
  check((await page.textContent(`${lastAssistant} .reasoning-body`)).length === stoppedAt, 'no text after stop');

  log('busy and unreachable servers give clear messages');
  await setting(page, '#max-tokens', '40');
  await page.route('**/v1/chat/completions', (route) =>
    route.fulfill({
      status: 503,
      headers: { 'Content-Type': 'application/json', 'Retry-After': '1' },
      body: JSON.stringify({ error: { message: 'the queue is full (32 waiting)', type: 'server_error', code: 'server_overloaded' } }),
    })
  );
  await ask(page, 'Are you busy?');
  let err = await page.textContent(`${lastAssistant} .msg-error`);
  check(/busy/.test(err) && /in 1 s/.test(err), `busy message: ${err}`);
  await page.unroute('**/v1/chat/completions');
  await page.route('**/v1/chat/completions', (route) => route.abort('connectionrefused'));
  await page.click(`${lastAssistant} .msg-error button:has-text("Retry")`);
  await page.waitForSelector(`${lastAssistant} .msg-error`);
  err = await page.textContent(`${lastAssistant} .msg-error`);
  check(/Cannot reach the splash server/.test(err), `unreachable message: ${err}`);
  check(await page.isVisible('#banner'), 'unreachable banner shown');
  check(await page.$eval('#status-dot', (d) => d.classList.contains('down')), 'status dot red');
  await page.unroute('**/v1/chat/completions');
  await page.click(`${lastAssistant} .msg-error button:has-text("Retry")`);
  await page.waitForSelector(`${lastAssistant} .stats`, { timeout: 30000 });
  check(await page.isHidden('#banner'), 'banner gone once the server answers');

  log('delete a chat');
  const before = (await chatTitles(page)).length;
  await page.hover('.chat-item.active');
  await page.click('.chat-item.active .chat-delete');
  check((await chatTitles(page)).length === before - 1, 'one chat fewer');

  log('a server with an API key: the page asks for it and then works');
  const keyed = await context.newPage();
  watch(keyed);
  await keyed.goto(KEYED_URL);
  await keyed.waitForSelector('.empty h1');
  check(await keyed.$eval('#api-key', (e) => e.classList.contains('needed')), 'key field marked as needed');
  await setting(keyed, '#max-tokens', '40');
  await ask(keyed, 'Hi there');
  err = await keyed.textContent(`${lastAssistant} .msg-error`);
  check(/needs an API key/.test(err), `key message: ${err}`);
  await setting(keyed, '#api-key', KEY);
  await keyed.click(`${lastAssistant} .msg-error button:has-text("Retry")`);
  await keyed.waitForSelector(`${lastAssistant} .stats`, { timeout: 30000 });
  check((await keyed.$$(`${lastAssistant} .msg-error`)).length === 0, 'answered with the key');
  await keyed.reload();
  await keyed.waitForSelector('.chat-item');
  check((await keyed.inputValue('#api-key')) === '', 'the key is not kept across reloads');
  check(!(await keyed.evaluate(() => JSON.stringify(localStorage))).includes(KEY), 'the key is not in localStorage');
  await keyed.close();

  log('screenshot of the first chat');
  await page.click('#settings summary');
  await page.click('.chat-item:has-text("Hello! What can you do?") .chat-open');
  await page.waitForSelector('.msg.user:has-text("Hello! What can you do?")');
  await page.$eval('.msg.assistant .reasoning', (d) => (d.open = true)); // show the first answer's reasoning
  await page.fill('#prompt', 'Thanks! Can you show me an example in Rust?');
  await page.evaluate(() => document.activeElement.blur());
  await page.evaluate(() => (document.getElementById('messages').scrollTop = 0));
  await page.waitForTimeout(400); // let the send button's fade-in finish
  mkdirSync(dirname(SHOT), { recursive: true });
  await page.screenshot({ path: SHOT });
  console.log(`  saved ${SHOT}`);

  log('markdown, highlighting and copy buttons in a stored answer');
  // The demo model writes noise, so this answer is stored the way the page stores answers
  // (a chat in localStorage) to check how markdown is rendered; nothing here is generated.
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: new URL(URL_).origin });
  await page.evaluate((text) => {
    const chats = JSON.parse(localStorage.getItem('splash.chats.v1'));
    const now = Date.now();
    chats.unshift({
      id: 'markdown-check', title: 'Markdown rendering check', created: now, updated: now,
      messages: [
        { role: 'user', content: 'How do I read a file line by line in Rust?' },
        { role: 'assistant', content: text, reasoning: 'The user wants idiomatic Rust: BufReader and lines().', thoughtMs: 840, status: 'done',
          stats: { tokens: 212, tps: 48.3, ttft: 180 } },
      ],
    });
    localStorage.setItem('splash.chats.v1', JSON.stringify(chats));
    localStorage.setItem('splash.current.v1', 'markdown-check');
  }, MARKDOWN_ANSWER);
  await page.reload();
  await page.waitForSelector('.code-block');
  check((await page.$$('.code-block .hl-k')).length > 3, 'keywords highlighted');
  check((await page.$$('.md table th')).length === 3, 'table rendered');
  await page.click('.code-block .copy-code');
  await page.waitForSelector('.code-block .copy-code:has-text("Copied")');
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  check(copied.startsWith('use std::fs::File;'), `code copied: ${copied.slice(0, 40)}`);
  await page.waitForTimeout(1600);
  const mdShot = SHOT.replace(/\.png$/, '-markdown.png');
  await page.screenshot({ path: mdShot });
  console.log(`  saved ${mdShot}`);

  log('a model with vision: attach an image, send it, get an answer');
  const vision = await context.newPage();
  watch(vision);
  await vision.goto(VISION_URL);
  await vision.waitForSelector('.empty h1');
  check(await vision.isVisible('#attach'), 'image attachment offered');
  await setting(vision, '#max-tokens', '8');
  await vision.setInputFiles('#file', { name: 'pattern.png', mimeType: 'image/png', buffer: patternPng(96, 64) });
  await vision.waitForSelector('#attachments .attachment img');
  await ask(vision, 'What is in this picture?');
  check((await vision.$$('.msg.user img')).length === 1, 'the image shown in the sent message');
  check((await vision.$$('#attachments .attachment')).length === 0, 'attachments cleared after sending');
  const answer = await vision.textContent(lastAssistant);
  check(await vision.isHidden('#banner'), `no error: ${await vision.textContent('#banner-text')}`);
  check(answer.trim().length > 0, 'answered');
  log('a model with vision: attach a PDF, send it, get an answer');
  await vision.setInputFiles('#file', { name: 'invoice.pdf', mimeType: 'application/pdf', buffer: textPdf(['Total due: 4,250 EUR']) });
  await vision.waitForSelector('#attachments .attachment .file-chip');
  await ask(vision, 'What is the total?');
  check((await vision.$$('.msg.user .file-chip')).length === 1, 'the PDF shown in the sent message');
  check(await vision.isHidden('#banner'), `no error: ${await vision.textContent('#banner-text')}`);
  check((await vision.textContent(lastAssistant)).trim().length > 0, 'answered the PDF question');
  const status = await serverStatus(VISION_URL);
  check(status.vision === true, 'the server reports vision');

  check(problems.length === 0, `no page errors:\n${problems.join('\n')}`);
  console.log('webui: all checks passed');
} catch (e) {
  console.error(`webui: FAILED at "${step}": ${e.stack || e}`);
  if (problems.length) console.error(problems.join('\n'));
  try {
    const pages = context.pages();
    if (pages.length) await pages[pages.length - 1].screenshot({ path: SHOT.replace(/\.png$/, '-failure.png') });
  } catch {
    /* best effort */
  }
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
