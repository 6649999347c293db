// The splash chat page: chats kept in localStorage, answers streamed from
// /v1/chat/completions, reasoning in a collapsible section, per-answer speed.
//
// State lives in `chats` (saved after every change) and `gen` (the one answer being
// streamed, with its AbortController). The API key stays in memory only.
(function () {
  'use strict';

  const $ = (id) => document.getElementById(id);
  const md = window.SplashMarkdown;
  const boot = JSON.parse($('boot').textContent);

  const STORE = 'splash.chats.v1';
  const CURRENT = 'splash.current.v1';
  const SETTINGS = 'splash.settings.v1';
  const MAX_CHATS = 50;
  const MAX_IMAGE_BYTES = 32 << 20;

  const server = {
    model: boot.model,
    vision: !!boot.vision,
    context: boot.context || 0,
    keyRequired: !!boot.key_required,
    reachable: true,
  };
  let apiKey = '';
  let chats = loadChats();
  let currentId = localStorage.getItem(CURRENT);
  let gen = null; // {chatId, msg, controller}
  let attachments = []; // {url, name, pdf}: data URLs of images and PDFs to send
  let banner = null; // {kind, text}

  // ------------------------------------------------------------------ storage

  function loadChats() {
    try {
      const v = JSON.parse(localStorage.getItem(STORE) || '[]');
      return Array.isArray(v) ? v.filter((c) => c && c.id && Array.isArray(c.messages)) : [];
    } catch {
      return [];
    }
  }

  function saveChats() {
    chats.sort((a, b) => b.updated - a.updated);
    if (chats.length > MAX_CHATS) chats.length = MAX_CHATS;
    for (;;) {
      try {
        localStorage.setItem(STORE, JSON.stringify(chats));
        if (currentId) localStorage.setItem(CURRENT, currentId);
        else localStorage.removeItem(CURRENT);
        return;
      } catch (e) {
        // Quota: drop the oldest chat that is not open, then retry.
        const victim = chats.map((c) => c.id).reverse().find((id) => id !== currentId);
        if (!victim) {
          showBanner('error', 'This browser has no room left to save chats: delete some old chats.');
          return;
        }
        chats = chats.filter((c) => c.id !== victim);
      }
    }
  }

  let saveTimer = 0;
  function saveSoon() {
    if (!saveTimer) saveTimer = setTimeout(() => ((saveTimer = 0), saveChats()), 500);
  }

  function loadSettings() {
    try {
      return JSON.parse(localStorage.getItem(SETTINGS) || '{}') || {};
    } catch {
      return {};
    }
  }

  function saveSettings() {
    localStorage.setItem(
      SETTINGS,
      JSON.stringify({ effort: $('effort').value, system: $('system-prompt').value, maxTokens: $('max-tokens').value })
    );
  }

  // ------------------------------------------------------------------ chats

  const currentChat = () => chats.find((c) => c.id === currentId) || null;

  function newId() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  function createChat() {
    const chat = { id: newId(), title: 'New chat', created: Date.now(), updated: Date.now(), messages: [] };
    chats.unshift(chat);
    return chat;
  }

  function selectChat(id) {
    currentId = id;
    attachments = [];
    saveChats();
    renderAll();
    closeSidebar();
  }

  function deleteChat(id) {
    if (gen && gen.chatId === id) gen.controller.abort();
    chats = chats.filter((c) => c.id !== id);
    if (currentId === id) currentId = chats.length ? chats[0].id : null;
    saveChats();
    renderAll();
  }

  function titleFrom(text) {
    const t = text.replace(/\s+/g, ' ').trim();
    return t.length > 48 ? t.slice(0, 47) + '…' : t || 'Image';
  }

  // ------------------------------------------------------------------ rendering

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function ago(t) {
    const s = (Date.now() - t) / 1000;
    if (s < 60) return 'just now';
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    if (s < 7 * 86400) return `${Math.floor(s / 86400)} d ago`;
    return new Date(t).toLocaleDateString();
  }

  function renderList() {
    const list = $('chat-list');
    list.textContent = '';
    if (!chats.length) {
      list.append(el('p', 'chat-list-empty', 'Your chats will appear here.'));
      return;
    }
    for (const c of chats) {
      const item = el('div', 'chat-item' + (c.id === currentId ? ' active' : ''));
      item.dataset.id = c.id;
      const open = el('button', 'chat-open');
      open.type = 'button';
      open.append(el('span', 'chat-title', c.title), el('span', 'chat-time', ago(c.updated)));
      if (gen && gen.chatId === c.id) open.append(el('span', 'chat-live', ''));
      open.addEventListener('click', () => selectChat(c.id));
      const del = el('button', 'chat-delete', '×');
      del.type = 'button';
      del.title = 'Delete this chat';
      del.setAttribute('aria-label', `Delete chat ${c.title}`);
      del.addEventListener('click', (e) => {
        e.stopPropagation();
        deleteChat(c.id);
      });
      item.append(open, del);
      list.append(item);
    }
  }

  function renderHeader() {
    $('model-name').textContent = server.model;
    $('model-ctx').textContent = server.context ? `${fmtTokens(server.context)} context` : '';
    const dot = $('status-dot');
    dot.className = 'dot ' + (server.reachable ? 'ok' : 'down');
    dot.title = server.reachable ? 'Server ready' : 'Server unreachable';
    $('prompt').placeholder = `Message ${server.model}`;
    $('attach').hidden = !server.vision;
    $('key-note').textContent = server.keyRequired
      ? 'this server needs one; kept in this tab only'
      : 'only if the server needs one; kept in this tab only';
    $('api-key').placeholder = server.keyRequired ? 'required' : 'not needed';
    $('api-key').classList.toggle('needed', server.keyRequired && !apiKey);
  }

  function fmtTokens(n) {
    if (n >= 1024 && n % 1024 === 0) return `${n / 1024}K`;
    return n.toLocaleString();
  }

  function emptyState() {
    const wrap = el('div', 'empty');
    const logo = document.querySelector('.brand .logo').cloneNode(true);
    wrap.append(logo, el('h1', '', `Chat with ${server.model}`));
    wrap.append(el('p', '', 'Served by splash on this machine. Nothing you type leaves it.'));
    const ideas = el('div', 'ideas');
    for (const idea of [
      // Tasks every model here can do, the bundled demo included (it knows only these).
      'What is 56 + 27?',
      'What is the capital of Peru?',
      'Write a Python function that checks whether a number is prime.',
      'What is the chemical symbol for gold?',
    ]) {
      const b = el('button', 'idea', idea);
      b.type = 'button';
      b.addEventListener('click', () => {
        $('prompt').value = idea;
        autosize();
        updateSend();
        $('prompt').focus();
      });
      ideas.append(b);
    }
    wrap.append(ideas);
    return wrap;
  }

  function renderMessages() {
    const box = $('messages');
    box.textContent = '';
    const chat = currentChat();
    if (!chat || !chat.messages.length) {
      box.append(emptyState());
      return;
    }
    const col = el('div', 'thread');
    chat.messages.forEach((m, i) => col.append(messageNode(m, i, chat)));
    box.append(col);
    box.scrollTop = box.scrollHeight;
  }

  function messageNode(m, index, chat) {
    if (m.role === 'user') {
      const node = el('article', 'msg user');
      const bubble = el('div', 'bubble');
      for (const url of m.images || []) {
        const img = el('img', 'thumb');
        img.src = url;
        img.alt = 'attached image';
        bubble.append(img);
      }
      for (const f of m.files || []) bubble.append(el('div', 'file-chip', `PDF · ${f.name}`));
      bubble.append(el('div', 'user-text', m.content));
      node.append(bubble);
      return node;
    }
    const node = el('article', 'msg assistant');
    node.dataset.index = index;
    const avatar = document.querySelector('.brand .logo').cloneNode(true);
    avatar.classList.add('avatar');
    const body = el('div', 'msg-body');
    node.append(avatar, body);
    fillAssistant(body, m, index === chat.messages.length - 1);
    return node;
  }

  // Builds (or rebuilds) the inside of an assistant message.
  function fillAssistant(body, m, isLast) {
    body.textContent = '';
    const streaming = m.status === 'streaming';
    if (m.reasoning) {
      const det = el('details', 'reasoning');
      const thinking = streaming && !m.content;
      det.open = m.reasoningOpen !== undefined ? m.reasoningOpen : thinking;
      const sum = el('summary', thinking ? 'thinking' : '');
      sum.textContent = thinking ? 'Thinking…' : m.thoughtMs ? `Thought for ${fmtSecs(m.thoughtMs)}` : 'Thoughts';
      det.append(sum, el('div', 'reasoning-body', m.reasoning));
      det.addEventListener('toggle', () => (m.reasoningOpen = det.open));
      body.append(det);
    }
    const content = el('div', 'content md');
    if (m.content) content.innerHTML = md.render(m.content);
    else if (streaming && !m.reasoning) content.append(el('span', 'waiting', ''));
    body.append(content);
    if (m.error) {
      const err = el('div', 'msg-error');
      err.append(el('span', '', m.error));
      if (isLast && !gen) {
        const retry = el('button', 'link-button', 'Retry');
        retry.type = 'button';
        retry.addEventListener('click', regenerate);
        err.append(retry);
      }
      body.append(err);
    }
    if (!streaming) {
      const meta = el('footer', 'meta');
      if (m.status === 'stopped') meta.append(el('span', 'tag', 'Stopped'));
      if (m.stats) meta.append(el('span', 'stats', statsText(m.stats)));
      const copy = el('button', 'link-button copy-msg', 'Copy');
      copy.type = 'button';
      copy.addEventListener('click', () => copyText(m.content || m.reasoning || '', copy));
      if (m.content || m.reasoning) meta.append(copy);
      if (isLast && !gen && !m.error) {
        const again = el('button', 'link-button', 'Regenerate');
        again.type = 'button';
        again.addEventListener('click', regenerate);
        meta.append(again);
      }
      body.append(meta);
    }
  }

  function fmtSecs(ms) {
    return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  }

  function statsText(s) {
    const parts = [];
    if (s.tokens !== undefined) parts.push(`${s.tokens} tokens`);
    if (s.tps) parts.push(`${s.tps.toFixed(1)} tok/s`);
    if (s.ttft !== undefined) parts.push(`TTFT ${fmtSecs(s.ttft)}`);
    return parts.join(' · ');
  }

  function renderAll() {
    renderHeader();
    renderList();
    renderMessages();
    renderAttachments();
    updateSend();
  }

  // Repaints the streaming message at most once per frame.
  let paintQueued = false;
  function paintStreaming() {
    if (paintQueued) return;
    paintQueued = true;
    requestAnimationFrame(() => {
      paintQueued = false;
      if (!gen || gen.chatId !== currentId) return;
      const chat = currentChat();
      const index = chat.messages.indexOf(gen.msg);
      const node = document.querySelector(`.msg.assistant[data-index="${index}"] .msg-body`);
      if (!node) return;
      const box = $('messages');
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      fillAssistant(node, gen.msg, true);
      if (atBottom) box.scrollTop = box.scrollHeight;
    });
  }

  // ------------------------------------------------------------------ banner

  function showBanner(kind, text) {
    banner = { kind, text };
    const b = $('banner');
    b.className = 'banner ' + kind;
    $('banner-text').textContent = text;
    b.hidden = false;
  }

  function hideBanner(kind) {
    if (!banner || (kind && banner.kind !== kind)) return;
    banner = null;
    $('banner').hidden = true;
  }

  // ------------------------------------------------------------------ API

  function headers() {
    const h = { 'Content-Type': 'application/json' };
    if (apiKey) h.Authorization = `Bearer ${apiKey}`;
    return h;
  }

  class ApiProblem extends Error {}

  // Turns a failed response into a message a person can act on.
  async function problem(res) {
    let detail = '';
    try {
      const body = await res.json();
      detail = (body.error && (body.error.message || body.error)) || '';
    } catch {
      /* not JSON */
    }
    if (res.status === 401) {
      server.keyRequired = true;
      renderHeader();
      openSettings();
      return new ApiProblem(
        apiKey
          ? 'The API key was not accepted. Check the key in Settings (the one splash was started with).'
          : 'This server needs an API key: enter it under Settings (left), then try again.'
      );
    }
    if (res.status === 503) {
      const after = res.headers.get('Retry-After');
      return new ApiProblem(
        `The server is busy (its queue is full${detail ? `: ${detail}` : ''}). Try again${after ? ` in ${after} s` : ' shortly'}.`
      );
    }
    return new ApiProblem(detail ? `${detail} (HTTP ${res.status})` : `The server answered HTTP ${res.status}.`);
  }

  function unreachable() {
    server.reachable = false;
    renderHeader();
    const msg = `Cannot reach the splash server at ${location.host}. Is \`splash serve\` still running?`;
    showBanner('down', msg);
    return msg;
  }

  // Reads an SSE body and calls onData for each `data:` payload.
  async function readEvents(body, onData) {
    const reader = body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
        const data = block
          .split(/\r?\n/)
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (data && onData(data) === false) return;
      }
    }
  }

  function apiMessages(chat, upTo) {
    const out = [];
    const system = $('system-prompt').value.trim();
    if (system) out.push({ role: 'system', content: system });
    for (const m of chat.messages) {
      if (m === upTo) break;
      if (m.role === 'user') {
        if ((m.images && m.images.length) || (m.files && m.files.length)) {
          out.push({
            role: 'user',
            content: [
              ...(m.files || []).map((f) => ({ type: 'file', file: { filename: f.name, file_data: f.url } })),
              ...(m.images || []).map((url) => ({ type: 'image_url', image_url: { url } })),
              { type: 'text', text: m.content },
            ],
          });
        } else out.push({ role: 'user', content: m.content });
      } else if (m.content || m.reasoning) {
        const a = { role: 'assistant', content: m.content || '' };
        if (m.reasoning) a.reasoning_content = m.reasoning;
        out.push(a);
      }
    }
    return out;
  }

  async function generate(chat) {
    const msg = { role: 'assistant', content: '', reasoning: '', status: 'streaming' };
    chat.messages.push(msg);
    chat.updated = Date.now();
    const controller = new AbortController();
    gen = { chatId: chat.id, msg, controller };
    saveChats();
    renderAll();

    const body = {
      model: server.model,
      messages: apiMessages(chat, msg),
      stream: true,
      stream_options: { include_usage: true },
    };
    const effort = $('effort').value;
    if (effort) body.reasoning_effort = effort;
    const max = parseInt($('max-tokens').value, 10);
    if (max > 0) body.max_tokens = max;

    const t0 = performance.now();
    let tFirst = 0;
    let tContent = 0;
    let usage = null;
    let timings = null;
    try {
      let res;
      try {
        res = await fetch('/v1/chat/completions', {
          method: 'POST',
          headers: headers(),
          body: JSON.stringify(body),
          signal: controller.signal,
        });
      } catch (e) {
        if (e.name === 'AbortError') throw e;
        throw new ApiProblem(unreachable());
      }
      if (!res.ok) throw await problem(res);
      markReachable();
      await readEvents(res.body, (data) => {
        if (data === '[DONE]') return false;
        let ev;
        try {
          ev = JSON.parse(data);
        } catch {
          return true;
        }
        if (ev.error) throw new ApiProblem(ev.error.message || 'The server reported an error.');
        if (ev.usage) usage = ev.usage;
        if (ev.timings) timings = ev.timings;
        const delta = ev.choices && ev.choices[0] && ev.choices[0].delta;
        if (!delta) return true;
        const r = delta.reasoning_content || '';
        const c = delta.content || '';
        if (r || c) {
          const now = performance.now();
          if (!tFirst) tFirst = now;
          if (c && !tContent) {
            tContent = now;
            if (msg.reasoning) msg.thoughtMs = now - tFirst;
          }
          msg.reasoning += r;
          msg.content += c;
          paintStreaming();
          saveSoon();
        }
        return true;
      });
      msg.status = 'done';
    } catch (e) {
      if (e.name === 'AbortError') msg.status = 'stopped';
      else {
        msg.status = 'error';
        msg.error = e instanceof ApiProblem ? e.message : `The answer was cut off: ${e.message || e}. The server may have stopped.`;
        if (!(e instanceof ApiProblem)) unreachable();
      }
    }
    const tEnd = performance.now();
    if (msg.reasoning && !msg.thoughtMs && tFirst) msg.thoughtMs = tEnd - tFirst;
    if (tFirst) {
      const tokens = usage ? usage.completion_tokens : undefined;
      const decodeMs = tEnd - tFirst;
      let tps = timings && timings.predicted_per_second;
      if (!tps && tokens > 1 && decodeMs > 0) tps = (tokens - 1) / (decodeMs / 1000);
      msg.stats = { ttft: tFirst - t0 };
      if (tokens !== undefined) msg.stats.tokens = tokens;
      if (tps) msg.stats.tps = tps;
    }
    delete msg.reasoningOpen;
    gen = null;
    chat.updated = Date.now();
    saveChats();
    renderAll();
  }

  function send() {
    const text = $('prompt').value.trim();
    if (gen || (!text && !attachments.length)) return;
    let chat = currentChat();
    if (!chat) {
      chat = createChat();
      currentId = chat.id;
    }
    const user = { role: 'user', content: text };
    const images = attachments.filter((a) => !a.pdf).map((a) => a.url);
    const files = attachments.filter((a) => a.pdf).map(({ name, url }) => ({ name, url }));
    if (images.length) user.images = images;
    if (files.length) user.files = files;
    chat.messages.push(user);
    if (chat.messages.length === 1) chat.title = titleFrom(text);
    $('prompt').value = '';
    attachments = [];
    autosize();
    generate(chat);
  }

  function regenerate() {
    const chat = currentChat();
    if (!chat || gen) return;
    const last = chat.messages[chat.messages.length - 1];
    if (last && last.role === 'assistant') chat.messages.pop();
    if (!chat.messages.length) return;
    generate(chat);
  }

  function stop() {
    if (gen) gen.controller.abort();
  }

  function markReachable() {
    if (!server.reachable) {
      server.reachable = true;
      renderHeader();
    }
    hideBanner('down');
  }

  // The model's name, context and vision; 401 means a key is needed.
  async function refreshStatus() {
    try {
      const res = await fetch('/status', { headers: headers() });
      markReachable();
      if (res.status === 401) {
        server.keyRequired = true;
        renderHeader();
        return;
      }
      if (!res.ok) return;
      const s = await res.json();
      server.model = s.model || server.model;
      server.context = s.maximum_context_tokens || server.context;
      server.vision = !!s.vision;
      renderHeader();
      if (!currentChat() || !currentChat().messages.length) renderMessages();
    } catch {
      unreachable();
    }
  }

  // A light liveness check: /health needs no key.
  async function poll() {
    if (document.visibilityState === 'visible' && !gen) {
      try {
        const res = await fetch('/health', { cache: 'no-store' });
        if (res.ok) {
          const wasDown = !server.reachable;
          markReachable();
          if (wasDown) refreshStatus();
        }
      } catch {
        unreachable();
      }
    }
    setTimeout(poll, 5000);
  }

  // ------------------------------------------------------------------ composer

  function autosize() {
    const t = $('prompt');
    t.style.height = 'auto';
    t.style.height = Math.min(t.scrollHeight, 240) + 'px';
  }

  function updateSend() {
    const busy = !!gen;
    $('send').hidden = busy;
    $('stop').hidden = !busy;
    $('send').disabled = !($('prompt').value.trim() || attachments.length);
  }

  function renderAttachments() {
    const box = $('attachments');
    box.textContent = '';
    attachments.forEach((a, i) => {
      const item = el('div', 'attachment');
      let shown;
      if (a.pdf) shown = el('div', 'file-chip', `PDF · ${a.name}`);
      else {
        shown = el('img');
        shown.src = a.url;
        shown.alt = 'image to send';
      }
      const rm = el('button', 'attachment-remove', '×');
      rm.type = 'button';
      rm.setAttribute('aria-label', `Remove ${a.name}`);
      rm.addEventListener('click', () => {
        attachments.splice(i, 1);
        renderAttachments();
        updateSend();
      });
      item.append(shown, rm);
      box.append(item);
    });
  }

  function addFiles(files) {
    if (!server.vision) return;
    for (const f of files) {
      const pdf = f.type === 'application/pdf';
      if (!pdf && !/^image\/(png|jpeg|webp|gif)$/.test(f.type)) continue;
      if (f.size > MAX_IMAGE_BYTES) {
        showBanner('error', `${f.name} is larger than 32 MiB.`);
        continue;
      }
      const r = new FileReader();
      r.onload = () => {
        attachments.push({ url: r.result, name: f.name, pdf });
        renderAttachments();
        updateSend();
      };
      r.readAsDataURL(f);
    }
  }

  // ------------------------------------------------------------------ copy

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // Pages on a LAN address are not a secure context: fall back to a selection.
      const t = el('textarea');
      t.value = text;
      document.body.append(t);
      t.select();
      document.execCommand('copy');
      t.remove();
    }
    const old = button.textContent;
    button.textContent = 'Copied';
    button.classList.add('copied');
    setTimeout(() => {
      button.textContent = old;
      button.classList.remove('copied');
    }, 1500);
  }

  // ------------------------------------------------------------------ sidebar

  function openSettings() {
    $('settings').open = true;
    openSidebar();
    $('api-key').focus();
  }

  function openSidebar() {
    $('app').classList.add('sidebar-open');
  }

  function closeSidebar() {
    $('app').classList.remove('sidebar-open');
  }

  // ------------------------------------------------------------------ wiring

  function init() {
    const s = loadSettings();
    if (s.effort !== undefined) $('effort').value = s.effort;
    if (s.system) $('system-prompt').value = s.system;
    if (s.maxTokens) $('max-tokens').value = s.maxTokens;
    if (!currentChat()) currentId = chats.length ? chats[0].id : null;

    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      send();
    });
    $('prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    $('prompt').addEventListener('input', () => {
      autosize();
      updateSend();
    });
    $('prompt').addEventListener('paste', (e) => {
      const files = [...(e.clipboardData ? e.clipboardData.files : [])];
      if (files.length && server.vision) {
        e.preventDefault();
        addFiles(files);
      }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && gen) stop();
    });
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', () => {
      const open = currentChat();
      if (open && !open.messages.length) return selectChat(open.id);
      selectChat(createChat().id);
      $('prompt').focus();
    });
    $('attach').addEventListener('click', () => $('file').click());
    $('file').addEventListener('change', (e) => {
      addFiles([...e.target.files]);
      e.target.value = '';
    });
    $('api-key').addEventListener('input', (e) => {
      apiKey = e.target.value.trim();
      renderHeader();
    });
    $('api-key').addEventListener('change', refreshStatus);
    for (const id of ['effort', 'system-prompt', 'max-tokens']) {
      $(id).addEventListener('change', saveSettings);
      $(id).addEventListener('input', saveSettings);
    }
    $('banner-close').addEventListener('click', () => hideBanner());
    $('toggle-sidebar').addEventListener('click', () => $('app').classList.toggle('sidebar-open'));
    $('messages').addEventListener('click', (e) => {
      const b = e.target.closest('[data-copy="code"]');
      if (b) copyText(b.closest('.code-block').querySelector('code').textContent, b);
      if (window.matchMedia('(max-width: 760px)').matches) closeSidebar();
    });
    // Another tab changed the chats: show them (unless this tab is streaming).
    window.addEventListener('storage', (e) => {
      if (e.key === STORE && !gen) {
        chats = loadChats();
        if (!currentChat()) currentId = chats.length ? chats[0].id : null;
        renderAll();
      }
    });
    setInterval(() => !gen && renderList(), 60000);

    renderAll();
    refreshStatus();
    setTimeout(poll, 5000);
    $('prompt').focus();
  }

  init();
})();
