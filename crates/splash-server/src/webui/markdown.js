// A small markdown renderer and syntax highlighter for the chat page, written for splash.
//
// Model output is untrusted: every piece of text is HTML-escaped, and links keep only http(s)
// and mailto targets. Supported: paragraphs, headings, fenced and indented code, block quotes,
// ordered / unordered / task lists (nested), GFM tables, rules, and inline code, bold, italic,
// strikethrough, links and bare URLs. An unclosed code fence (a streaming answer) renders as
// code up to the end. The highlighter knows the common languages by keyword lists and one
// tokenising regex per family.
(function (root) {
  'use strict';

  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

  // ---------------------------------------------------------------- inline

  // Placeholders: \u0001 index \u0002 stand for already-rendered HTML while the rest is escaped.
  const PH = /\u0001(\d+)\u0002/g;

  function safeUrl(url) {
    const u = url.trim();
    return /^(https?:\/\/|mailto:)/i.test(u) ? u : null;
  }

  function link(href, inner) {
    return `<a href="${esc(href)}" target="_blank" rel="noopener noreferrer">${inner}</a>`;
  }

  const INLINE = new RegExp(
    [
      /(`+)([^`][\s\S]*?)\1(?!`)/.source, // 1-2 code span
      /\\([\\`*_{}[\]()#+\-.!|~<>])/.source, // 3 backslash escape
      /(!?)\[((?:[^\]\\]|\\.)*)\]\(\s*<?([^\s)>]*)>?(?:\s+"[^"]*")?\s*\)/.source, // 4-6 link / image
      /<((?:https?:\/\/|mailto:)[^\s>]+)>/.source, // 7 autolink
      /((?:https?:\/\/)[^\s<]*[^\s<.,:;"')\]!?*_~])/.source, // 8 bare URL
    ].join('|'),
    'g'
  );

  function emphasis(s) {
    return s
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>')
      .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, '$1<strong>$2</strong>')
      .replace(/\*(?=[^\s*])([^*]*?[^\s*])\*/g, '<em>$1</em>')
      .replace(/\*(?=[^\s*])([^\s*])\*/g, '<em>$1</em>')
      .replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_]|[^\s_])_(?!\w)/g, '$1<em>$2</em>')
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
  }

  function inline(text) {
    const saved = [];
    const keep = (html) => `\u0001${saved.push(html) - 1}\u0002`;
    const marked = text.replace(INLINE, (m, ticks, code, escd, bang, label, url, auto, bare) => {
      if (ticks) return keep(`<code>${esc(code.replace(/^ ([\s\S]*) $/, '$1'))}</code>`);
      if (escd) return keep(esc(escd));
      if (label !== undefined) {
        const href = safeUrl(url);
        const inner = bang ? esc(label || url) : inline(label);
        if (!href) return keep(inner);
        return keep(link(href, bang ? `[image: ${inner}]` : inner));
      }
      const href = auto || bare;
      return keep(link(href, esc(href)));
    });
    // Hard line breaks: two trailing spaces or a backslash; soft breaks stay visible in chat.
    const html = emphasis(esc(marked)).replace(/(?: {2,}|\\)?\n/g, '<br>');
    return html.replace(PH, (_, i) => saved[+i]);
  }

  // ---------------------------------------------------------------- blocks

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])(?:\s+(.*)|$)/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$/;

  function startsBlock(line, next) {
    return (
      FENCE.test(line) ||
      HEADING.test(line) ||
      RULE.test(line) ||
      QUOTE.test(line) ||
      ITEM.test(line) ||
      (line.includes('|') && next !== undefined && TABLE_SEP.test(next) && next.includes('-'))
    );
  }

  function cells(row) {
    let r = row.trim();
    if (r.startsWith('|')) r = r.slice(1);
    if (r.endsWith('|') && !r.endsWith('\\|')) r = r.slice(0, -1);
    const out = [];
    let cur = '';
    let code = false;
    for (let i = 0; i < r.length; i++) {
      const c = r[i];
      if (c === '\\' && r[i + 1] === '|') {
        cur += '|';
        i++;
      } else if (c === '`') {
        code = !code;
        cur += c;
      } else if (c === '|' && !code) {
        out.push(cur.trim());
        cur = '';
      } else cur += c;
    }
    out.push(cur.trim());
    return out;
  }

  function table(lines) {
    const head = cells(lines[0]);
    const align = cells(lines[1]).map((c) =>
      c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : ''
    );
    const td = (tag, c, i) => `<${tag}${align[i] ? ` class="al-${align[i]}"` : ''}>${inline(c)}</${tag}>`;
    let html = '<div class="table-wrap"><table><thead><tr>';
    html += head.map((c, i) => td('th', c, i)).join('') + '</tr></thead><tbody>';
    for (const row of lines.slice(2)) {
      const cs = cells(row);
      html += '<tr>' + head.map((_, i) => td('td', cs[i] || '', i)).join('') + '</tr>';
    }
    return html + '</tbody></table></div>';
  }

  function codeBlock(code, lang) {
    const name = (lang || '').toLowerCase();
    const label = name || 'text';
    return (
      `<div class="code-block"><div class="code-head"><span class="code-lang">${esc(label)}</span>` +
      `<button type="button" class="copy-code" data-copy="code">Copy</button></div>` +
      `<pre><code class="hl lang-${esc(name.replace(/[^a-z0-9+#-]/g, ''))}">${highlight(code, name)}</code></pre></div>`
    );
  }

  function list(lines, start) {
    const first = lines[start].match(ITEM);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    let i = start;
    let loose = false;
    while (i < lines.length) {
      const m = lines[i].match(ITEM);
      if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
      const content = m[3] || '';
      // Continuation lines are indented to the item's text.
      const pad = m[3] ? m[0].length - m[3].length : indent + m[2].length + 1;
      const body = [content];
      i++;
      while (i < lines.length) {
        const l = lines[i];
        if (l.trim() === '') {
          // A blank line continues the item only if indented content follows.
          let j = i + 1;
          while (j < lines.length && lines[j].trim() === '') j++;
          if (j < lines.length && lines[j].search(/\S/) > indent) {
            loose = loose || !ITEM.test(lines[j]) || lines[j].match(ITEM)[1].length === indent;
            for (; i < j; i++) body.push('');
            continue;
          }
          break;
        }
        const lead = l.search(/\S/);
        const sub = l.match(ITEM);
        if (lead > indent) body.push(l.slice(Math.min(lead, pad)));
        else if (!sub && !startsBlock(l)) body.push(l.trim()); // lazy continuation
        else break;
        i++;
      }
      items.push(body);
    }
    const startAttr = ordered && parseInt(first[2], 10) !== 1 ? ` start="${parseInt(first[2], 10)}"` : '';
    let html = ordered ? `<ol${startAttr}>` : '<ul>';
    for (const body of items) {
      let task = '';
      const t = body[0].match(/^\[([ xX])\]\s+(.*)$/);
      if (t) {
        task = `<input type="checkbox" disabled${t[1] === ' ' ? '' : ' checked'}> `;
        body[0] = t[2];
      }
      let inner = blocks(body);
      if (!loose) inner = inner.replace(/^<p>([\s\S]*?)<\/p>/, '$1').replace(/<p>([\s\S]*?)<\/p>$/, '$1');
      html += `<li${task ? ' class="task"' : ''}>${task}${inner}</li>`;
    }
    return [html + (ordered ? '</ol>' : '</ul>'), i];
  }

  function blocks(lines) {
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (line.trim() === '') {
        i++;
        continue;
      }
      let m;
      if ((m = line.match(FENCE))) {
        const fence = m[1];
        const indent = line.search(/\S/);
        const code = [];
        i++;
        while (i < lines.length) {
          const l = lines[i];
          const t = l.trim();
          if (t.startsWith(fence[0].repeat(fence.length)) && /^[`~]+$/.test(t)) {
            i++;
            break;
          }
          code.push(l.slice(Math.min(indent, l.search(/\S|$/))));
          i++;
        }
        out.push(codeBlock(code.join('\n'), m[2]));
        continue;
      }
      if (/^( {4}|\t)/.test(line)) {
        const code = [];
        while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || lines[i].trim() === '')) {
          code.push(lines[i].replace(/^( {4}|\t)/, ''));
          i++;
        }
        while (code.length && code[code.length - 1].trim() === '') code.pop();
        out.push(codeBlock(code.join('\n'), ''));
        continue;
      }
      if ((m = line.match(HEADING))) {
        const n = m[1].length;
        out.push(`<h${n}>${inline(m[2] || '')}</h${n}>`);
        i++;
        continue;
      }
      if (RULE.test(line)) {
        out.push('<hr>');
        i++;
        continue;
      }
      if (QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && lines[i].trim() !== '') {
          const q = lines[i].match(QUOTE);
          if (q) inner.push(q[1]);
          else if (startsBlock(lines[i])) break;
          else inner.push(lines[i]);
          i++;
        }
        out.push(`<blockquote>${blocks(inner)}</blockquote>`);
        continue;
      }
      if (ITEM.test(line) && line.search(/\S/) <= 3) {
        const [html, next] = list(lines, i);
        out.push(html);
        i = next;
        continue;
      }
      if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes('-')) {
        const rows = [line, lines[i + 1]];
        i += 2;
        while (i < lines.length && lines[i].includes('|') && lines[i].trim() !== '') rows.push(lines[i++]);
        out.push(table(rows));
        continue;
      }
      const para = [line.replace(/^\s+/, '')];
      i++;
      while (i < lines.length && lines[i].trim() !== '' && !startsBlock(lines[i], lines[i + 1])) {
        para.push(lines[i].replace(/^\s+/, ''));
        i++;
      }
      out.push(`<p>${inline(para.join('\n'))}</p>`);
    }
    return out.join('');
  }

  function render(src) {
    return blocks(String(src || '').replace(/\r\n?/g, '\n').split('\n'));
  }

  // ---------------------------------------------------------------- highlighting

  const words = (s) => new Set(s.split(/\s+/).filter(Boolean));

  const C_LIKE_TYPES = 'int long short char float double void bool unsigned signed size_t auto';
  const LANGS = {
    js: {
      kw: words(
        'async await break case catch class const continue debugger default delete do else export extends finally for from function if import in instanceof let new of return static super switch this throw try typeof var void while with yield get set as interface type enum implements declare readonly private public protected namespace keyof satisfies'
      ),
      lit: words('true false null undefined NaN Infinity'),
      types: words('string number boolean any unknown never object bigint symbol'),
      line: '//',
      block: true,
      strings: ['"', "'", '`'],
    },
    py: {
      kw: words(
        'and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case self cls'
      ),
      lit: words('True False None'),
      types: words('int float str bool list dict set tuple bytes object type'),
      line: '#',
      triple: true,
      strings: ['"', "'"],
      decorators: true,
    },
    rust: {
      kw: words(
        'as async await break const continue crate dyn else enum extern fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait type unsafe use where while'
      ),
      lit: words('true false None Some Ok Err'),
      types: words('i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 bool char str String Vec Option Result Box'),
      line: '//',
      block: true,
      strings: ['"'],
      macros: true,
      lifetimes: true,
    },
    c: {
      kw: words(
        'break case catch class const constexpr continue default delete do else enum explicit extern for friend goto if inline namespace new noexcept operator override private protected public register return sizeof static static_cast struct switch template this throw try typedef typename union using virtual volatile while abstract extends final implements import instanceof interface package super synchronized throws transient var val fun when object is in out internal companion lateinit data sealed open func guard let defer'
      ),
      lit: words('true false NULL nullptr null nil'),
      types: words(C_LIKE_TYPES + ' std string vector uint8_t uint16_t uint32_t uint64_t int8_t int16_t int32_t int64_t String Integer Boolean byte'),
      line: '//',
      block: true,
      strings: ['"', "'"],
      preprocessor: true,
    },
    go: {
      kw: words(
        'break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var'
      ),
      lit: words('true false nil iota'),
      types: words('int int8 int16 int32 int64 uint uint8 uint16 uint32 uint64 uintptr float32 float64 complex64 complex128 byte rune string bool error any'),
      line: '//',
      block: true,
      strings: ['"', '`', "'"],
    },
    sh: {
      kw: words(
        'if then else elif fi for while until do done case esac in function return exit export local readonly set unset shift source alias echo cd pwd exec eval trap sudo'
      ),
      lit: words('true false'),
      types: words(''),
      line: '#',
      strings: ['"', "'"],
      vars: true,
    },
    json: { kw: words(''), lit: words('true false null'), types: words(''), strings: ['"'], keys: true },
    yaml: { kw: words(''), lit: words('true false null yes no on off'), types: words(''), line: '#', strings: ['"', "'"], keys: true },
    sql: {
      kw: words(
        'select from where and or not insert into values update set delete create table index view drop alter add primary key foreign references join left right inner outer full on group by order asc desc having limit offset as distinct union all case when then else end in is like between exists returning with begin commit rollback'
      ),
      lit: words('null true false'),
      types: words('int integer bigint smallint text varchar char boolean date timestamp float real numeric serial json jsonb'),
      line: '--',
      block: true,
      strings: ["'", '"'],
      nocase: true,
    },
    css: { kw: words(''), lit: words(''), types: words(''), block: true, strings: ['"', "'"], css: true },
  };
  const ALIASES = {
    javascript: 'js', jsx: 'js', ts: 'js', typescript: 'js', tsx: 'js', mjs: 'js', cjs: 'js', node: 'js',
    python: 'py', python3: 'py', py3: 'py',
    rs: 'rust',
    cpp: 'c', 'c++': 'c', cc: 'c', h: 'c', hpp: 'c', cxx: 'c', cs: 'c', csharp: 'c', java: 'c', kotlin: 'c', kt: 'c', swift: 'c', cuda: 'c', cu: 'c', objc: 'c', php: 'c', scala: 'c', dart: 'c',
    golang: 'go',
    bash: 'sh', shell: 'sh', zsh: 'sh', console: 'sh', shellsession: 'sh', fish: 'sh', dockerfile: 'sh', makefile: 'sh', make: 'sh', ps1: 'sh', powershell: 'sh',
    jsonc: 'json', json5: 'json',
    yml: 'yaml', toml: 'yaml', ini: 'yaml', conf: 'yaml', cfg: 'yaml',
    postgres: 'sql', postgresql: 'sql', mysql: 'sql', sqlite: 'sql',
    scss: 'css', less: 'css',
  };
  const MARKUP = words('html xml svg xhtml vue svelte');

  const STRING_RE = {
    '"': /"(?:\\[\s\S]|[^"\\\n])*"?/.source,
    "'": /'(?:\\[\s\S]|[^'\\\n])*'?/.source,
    '`': /`(?:\\[\s\S]|[^`\\])*`?/.source,
  };

  const span = (cls, text) => `<span class="hl-${cls}">${esc(text)}</span>`;

  function tokenizer(lang) {
    if (lang.re) return lang.re;
    const parts = [];
    const kinds = [];
    const add = (re, kind) => {
      parts.push(`(${re})`);
      kinds.push(kind);
    };
    if (lang.block) add(/\/\*[\s\S]*?(?:\*\/|$)/.source, 'c');
    if (lang.line === '//') add(/\/\/.*/.source, 'c');
    if (lang.line === '#') add(/#.*/.source, 'c');
    if (lang.line === '--') add(/--.*/.source, 'c');
    if (lang.triple) add(/(?:[rRbBuUfF]{0,2})(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$))/.source, 's');
    if (lang.keys) add(/"(?:\\.|[^"\\\n])*"(?=\s*:)|[A-Za-z_][\w.-]*(?=\s*[:=](?:\s|$))/.source, 'key');
    for (const q of lang.strings) add(STRING_RE[q], 's');
    if (lang.lifetimes) add(/'[a-z_]\w*(?!')/.source, 'l');
    if (lang.vars) add(/\$\{[^}\n]*\}|\$[\w@#?$!*-]/.source, 'v');
    if (lang.decorators) add(/@[\w.]+/.source, 'f');
    if (lang.preprocessor) add(/^[ \t]*#[ \t]*\w+/.source, 'k');
    if (lang.css) {
      add(/[.#][\w-]+(?=[^{};]*\{)|@[\w-]+/.source, 'f');
      add(/[\w-]+(?=\s*:[^;{}]*[;}])/.source, 'key');
      add(/#[\da-fA-F]{3,8}\b/.source, 'n');
    }
    add(/\b(?:0[xX][\da-fA-F_]+|0[bB][01_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?)(?:[a-zA-Z]\w*)?\b/.source, 'n');
    add(/[A-Za-z_$][\w$]*!?/.source, 'w');
    lang.re = new RegExp(parts.join('|'), 'gm');
    lang.kinds = kinds;
    return lang.re;
  }

  function highlightMarkup(code) {
    const re = /(<!--[\s\S]*?(?:-->|$))|(<\/?)([\w:.-]+)|([\w:.-]+)(?==)|("[^"]*"?|'[^']*'?)|(\/?>)/g;
    let out = '';
    let last = 0;
    let inTag = false;
    let m;
    while ((m = re.exec(code))) {
      out += esc(code.slice(last, m.index));
      if (m[1]) out += span('c', m[1]);
      else if (m[2]) {
        out += esc(m[2]) + span('k', m[3]);
        inTag = true;
      } else if (m[4] && inTag) out += span('key', m[4]);
      else if (m[5] && inTag) out += span('s', m[5]);
      else if (m[6]) {
        out += esc(m[6]);
        inTag = false;
      } else out += esc(m[0]);
      last = re.lastIndex;
    }
    return out + esc(code.slice(last));
  }

  function highlight(code, name) {
    const key = ALIASES[name] || name;
    if (MARKUP.has(key)) return highlightMarkup(code);
    const lang = LANGS[key];
    if (!lang) return esc(code);
    const re = tokenizer(lang);
    re.lastIndex = 0;
    let out = '';
    let last = 0;
    let m;
    while ((m = re.exec(code))) {
      if (m[0] === '') {
        re.lastIndex++;
        continue;
      }
      out += esc(code.slice(last, m.index));
      last = re.lastIndex;
      const g = m.findIndex((x, i) => i > 0 && x !== undefined);
      const kind = lang.kinds[g - 1];
      const text = m[0];
      if (kind !== 'w') {
        out += span(kind, text);
        continue;
      }
      const w = lang.nocase ? text.toLowerCase() : text;
      if (lang.macros && text.endsWith('!')) out += span('f', text);
      else if (lang.kw.has(w)) out += span('k', text);
      else if (lang.lit.has(w)) out += span('l', text);
      else if (lang.types.has(w) || (/^[A-Z][a-z0-9]\w*$/.test(text) && key !== 'sql')) out += span('t', text);
      else if (/^\s*\(/.test(code.slice(last))) out += span('f', text);
      else out += esc(text);
    }
    return out + esc(code.slice(last));
  }

  const api = { render, inline, highlight, escape: esc };
  root.SplashMarkdown = api;
  if (typeof module === 'object' && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : globalThis);
