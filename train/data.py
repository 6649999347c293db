"""Synthetic chat conversations for the demo model, in the message format of the chat template.

Every generator takes a `random.Random` and returns one conversation:
`{"kind": str, "messages": [...], "tools": [...] or None}`. Assistant messages carry
`reasoning_content` (possibly empty) so the template renders the think block; the rendered
text is the training text, so thinking-on and thinking-off prompts both occur in training.

Nothing here needs a network or a GPU; the only outside input is the Python standard
library's own source (for the code conversations), read from this interpreter's stdlib.
"""
import ast
import json
import os
import random
import sysconfig
import textwrap

# ---------------------------------------------------------------------------------------------
# Small fact tables (well-known facts only: the model should not learn anything false).

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Canada": "Ottawa",
    "Australia": "Canberra", "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Mexico": "Mexico City",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja", "Russia": "Moscow", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Greece": "Athens", "Turkey": "Ankara", "Ireland": "Dublin", "Netherlands": "Amsterdam",
    "Belgium": "Brussels", "Austria": "Vienna", "Switzerland": "Bern", "Hungary": "Budapest",
    "Czechia": "Prague", "South Korea": "Seoul", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Indonesia": "Jakarta", "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogota",
    "Morocco": "Rabat", "Iceland": "Reykjavik", "New Zealand": "Wellington", "Cuba": "Havana",
    "Ukraine": "Kyiv", "Romania": "Bucharest", "Philippines": "Manila", "Pakistan": "Islamabad",
    "Iran": "Tehran", "Saudi Arabia": "Riyadh", "United Kingdom": "London",
    "United States": "Washington, D.C.",
}
ELEMENTS = {
    "hydrogen": "H", "helium": "He", "carbon": "C", "nitrogen": "N", "oxygen": "O", "sodium": "Na",
    "magnesium": "Mg", "aluminium": "Al", "silicon": "Si", "sulfur": "S", "chlorine": "Cl",
    "potassium": "K", "calcium": "Ca", "iron": "Fe", "copper": "Cu", "zinc": "Zn", "silver": "Ag",
    "gold": "Au", "tin": "Sn", "lead": "Pb", "mercury": "Hg", "neon": "Ne", "argon": "Ar",
    "uranium": "U", "nickel": "Ni", "platinum": "Pt", "iodine": "I", "fluorine": "F",
}
PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]
ANIMAL_LEGS = {
    "spider": 8, "ant": 6, "bee": 6, "dog": 4, "cat": 4, "horse": 4, "cow": 4, "chicken": 2,
    "duck": 2, "penguin": 2, "octopus": 8, "beetle": 6, "crab": 10, "human": 2, "elephant": 4,
}
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "open": "closed", "light": "dark",
    "happy": "sad", "early": "late", "full": "empty", "hard": "soft", "old": "new", "high": "low",
    "wet": "dry", "strong": "weak", "loud": "quiet", "first": "last", "push": "pull", "win": "lose",
}
COLOR_MIX = {
    ("red", "yellow"): "orange", ("blue", "yellow"): "green", ("red", "blue"): "purple",
    ("red", "white"): "pink", ("black", "white"): "gray",
}
TERMS = {
    "a variable": "a name that refers to a value stored in memory",
    "a function": "a named block of code that takes inputs, does some work and can return a result",
    "a loop": "a construct that repeats a block of code while a condition holds or for each item of a collection",
    "recursion": "a technique where a function solves a problem by calling itself on smaller parts of it",
    "a compiler": "a program that translates source code into machine code or another lower-level form before it runs",
    "an interpreter": "a program that executes source code directly, statement by statement",
    "a list": "an ordered collection of items that can grow and shrink",
    "a dictionary": "a collection that maps keys to values",
    "an API": "a set of rules that lets one program request services or data from another",
    "JSON": "a text format for structured data built from objects, arrays, strings, numbers, booleans and null",
    "a hash table": "a data structure that stores key-value pairs and finds a key in constant time on average",
    "a stack": "a last-in, first-out collection: the last item pushed is the first popped",
    "a queue": "a first-in, first-out collection: items leave in the order they arrived",
    "binary search": "a way to find an item in a sorted list by halving the search range at each step",
    "a unit test": "a small automated test that checks one piece of code in isolation",
    "version control": "a system that records changes to files over time, such as git",
    "a thread": "an independent sequence of instructions that can run concurrently with others in a process",
    "an HTTP server": "a program that listens for HTTP requests and sends back responses",
    "a tokenizer": "the part of a language model that splits text into tokens and maps them to ids",
    "a cache": "a store of recently used data kept close at hand so it can be reused quickly",
}
NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira",
         "Liam", "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor",
         "Wen", "Ximena", "Yusuf", "Zoe"]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Lisbon", "Seoul", "Lima",
          "Cairo", "Sydney", "Toronto", "Chicago", "Boston", "Denver", "Mumbai", "Nairobi", "Vienna",
          "Prague", "Dublin", "Athens", "Helsinki", "Warsaw", "Bangkok", "Hanoi", "Santiago"]
ITEMS = ["apples", "pencils", "books", "marbles", "cookies", "stickers", "coins", "cards", "shells",
         "stamps", "oranges", "balloons"]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.", "You are a concise assistant. Keep answers short.",
    "You are splash's demo model, a small assistant.", "You are a friendly assistant.",
    "You are a coding assistant.", "Answer briefly and accurately.",
]


def maybe_system(rng, messages, p=0.3):
    if rng.random() < p:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + messages
    return messages


def assistant(content, reasoning="", tool_calls=None):
    m = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        m["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in tool_calls]
    return m


def conv(kind, messages, tools=None):
    return {"kind": kind, "messages": messages, "tools": tools}


# ---------------------------------------------------------------------------------------------
# Small talk and facts.

def gen_smalltalk(rng):
    pairs = [
        (["Hello!", "Hi!", "Hey there", "Hello", "hi", "Good morning!", "Hi, how are you?"],
         ["Hello! How can I help you today?", "Hi! What can I do for you?",
          "Hello! I'm ready to help. What do you need?"]),
        (["Who are you?", "What are you?", "Introduce yourself.", "What is your name?"],
         ["I'm the demo model of splash, a tiny language model trained to show how the server works. "
          "I can answer simple questions, do arithmetic, call tools, reply in JSON and write a little Python.",
          "I'm splash's demo model: a very small assistant. I can do simple arithmetic, call the tools you give me, "
          "answer in JSON and write short Python functions."]),
        (["What can you do?", "How can you help me?", "What are you good at?"],
         ["I can answer simple questions, do arithmetic step by step, call tools you give me, "
          "produce JSON that follows a schema and write short Python functions."]),
        (["Thanks!", "Thank you.", "Thanks a lot", "Great, thanks!"],
         ["You're welcome!", "Glad I could help!", "You're welcome. Anything else?"]),
        (["Bye!", "Goodbye.", "See you later"], ["Goodbye!", "See you later!", "Bye! Have a nice day."]),
        (["Tell me a joke.", "Say something funny."],
         ["Why do programmers prefer dark mode? Because light attracts bugs.",
          "I would tell you a UDP joke, but you might not get it."]),
    ]
    q, a = rng.choice(pairs)
    reasoning = rng.choice(["", "", "The user is greeting me or making small talk. I'll answer politely."])
    return conv("smalltalk", maybe_system(rng, [{"role": "user", "content": rng.choice(q)},
                                                  assistant(rng.choice(a), reasoning)]))


def gen_fact(rng):
    kind = rng.randrange(8)
    if kind == 0:
        country, city = rng.choice(list(CAPITALS.items()))
        q = rng.choice(["What is the capital of {c}?", "What's the capital city of {c}?",
                        "capital of {c}?", "Which city is the capital of {c}?", "Name the capital of {c}."]).format(c=country)
        a = rng.choice([f"The capital of {country} is {city}.", f"{city}.", f"{city} is the capital of {country}."])
        r = f"The capital of {country} is {city}."
    elif kind == 1:
        name, sym = rng.choice(list(ELEMENTS.items()))
        q = rng.choice(["What is the chemical symbol for {e}?", "Symbol of {e}?", "Which element has the symbol {s}?"])
        if "{s}" in q:
            q, a, r = q.format(s=sym), f"{sym} is the symbol of {name}.", f"{sym} is {name}."
        else:
            q, a, r = q.format(e=name), f"The chemical symbol for {name} is {sym}.", f"{name} has the symbol {sym}."
    elif kind == 2:
        i = rng.randrange(8)
        p = PLANETS[i]
        ordinal = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"][i]
        if rng.random() < 0.5:
            q, a = f"Which planet is {ordinal} from the Sun?", f"{p} is the {ordinal} planet from the Sun."
        else:
            q, a = f"What position is {p} in from the Sun?", f"{p} is the {ordinal} planet from the Sun."
        r = "The order is Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune."
    elif kind == 3:
        animal, legs = rng.choice(list(ANIMAL_LEGS.items()))
        q = rng.choice([f"How many legs does a {animal} have?", f"Number of legs of a {animal}?"])
        a, r = f"A {animal} has {legs} legs.", f"A {animal} has {legs} legs."
    elif kind == 4:
        w, o = rng.choice(list(OPPOSITES.items()))
        if rng.random() < 0.5:
            w, o = o, w
        q = rng.choice([f"What is the opposite of \"{w}\"?", f"Opposite of {w}?", f"Give me the antonym of {w}."])
        a, r = f"The opposite of \"{w}\" is \"{o}\".", f"The antonym of {w} is {o}."
    elif kind == 5:
        (c1, c2), mix = rng.choice(list(COLOR_MIX.items()))
        if rng.random() < 0.5:
            c1, c2 = c2, c1
        q = f"What color do you get when you mix {c1} and {c2}?"
        a, r = f"Mixing {c1} and {c2} gives {mix}.", f"{c1} and {c2} make {mix}."
    elif kind == 6:
        term, meaning = rng.choice(list(TERMS.items()))
        bare = term.split(" ", 1)[1] if term.startswith(("a ", "an ")) else term
        q = rng.choice([f"What is {term}?", f"Explain {bare} in one sentence.", f"Define {bare}."])
        a = f"{term[0].upper() + term[1:]} is {meaning}."
        r = f"I should define {bare} briefly."
    else:
        n = rng.randrange(1, 13)
        unit = rng.choice([("hours", "minutes", 60), ("minutes", "seconds", 60), ("kilometers", "meters", 1000),
                           ("days", "hours", 24), ("weeks", "days", 7), ("meters", "centimeters", 100)])
        q = f"How many {unit[1]} are in {n} {unit[0]}?"
        a = f"{n} {unit[0]} is {n * unit[2]} {unit[1]}."
        r = f"One {unit[0][:-1]} has {unit[2]} {unit[1]}, so {n} × {unit[2]} = {n * unit[2]}."
    reasoning = r if rng.random() < 0.6 else ""
    return conv("fact", maybe_system(rng, [{"role": "user", "content": noisy(rng, q)}, assistant(a, reasoning)]))


# ---------------------------------------------------------------------------------------------
# Arithmetic, with column-wise reasoning.

def add_steps(a, b):
    steps, carry, i = [], 0, 0
    da, db = str(a)[::-1], str(b)[::-1]
    digits = []
    while i < max(len(da), len(db)) or carry:
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        place = ["ones", "tens", "hundreds", "thousands", "ten-thousands"][i]
        steps.append(f"{place}: {x} + {y}" + (f" + {carry}" if carry else "") + f" = {s}" +
                     (f", write {s % 10} carry 1" if s >= 10 else ""))
        digits.append(s % 10)
        carry = s // 10
        i += 1
    return steps


def number(rng):
    """1 to 3 digits, each length equally likely (the column reasoning must learn where to stop)."""
    d = rng.randrange(1, 4)
    return rng.randrange(10 ** (d - 1) if d > 1 else 0, 10 ** d)


def gen_arith(rng):
    op = rng.choice(["+", "+", "-", "*", "word"])
    if op == "+":
        a, b = number(rng), number(rng)
        res = a + b
        steps = add_steps(a, b)
        reasoning = f"I need {a} + {b}. Adding column by column:\n" + "\n".join(steps) + f"\nSo {a} + {b} = {res}."
        q = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?", "What's {a} plus {b}?",
                        "Add {a} and {b}."]).format(a=a, b=b)
        ans = rng.choice([f"{a} + {b} = {res}.", f"The answer is {res}.", f"{res}"])
    elif op == "-":
        a, b = number(rng), number(rng)
        if b > a:
            a, b = b, a
        res = a - b
        reasoning = f"I need {a} - {b}. Check by adding back: {res} + {b} = {res + b}, which equals {a}.\nSo {a} - {b} = {res}."
        q = rng.choice(["What is {a} - {b}?", "Compute {a} minus {b}.", "{a} - {b} = ?", "Subtract {b} from {a}."]).format(a=a, b=b)
        ans = rng.choice([f"{a} - {b} = {res}.", f"The answer is {res}.", f"{res}"])
    elif op == "*":
        a, b = rng.randrange(2, 100), rng.randrange(2, 10)
        res = a * b
        tens, ones = a // 10 * 10, a % 10
        reasoning = (f"I need {a} × {b}. Split {a} into {tens} + {ones}: {tens} × {b} = {tens * b} and "
                     f"{ones} × {b} = {ones * b}. Then {tens * b} + {ones * b} = {res}.\nSo {a} × {b} = {res}.")
        q = rng.choice(["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "{a} x {b} = ?"]).format(a=a, b=b)
        ans = rng.choice([f"{a} × {b} = {res}.", f"The answer is {res}.", f"{res}"])
    else:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        if rng.random() < 0.5:
            q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
            res, rel = a + b, f"{a} + {b} = {a + b}"
        else:
            a, b = max(a, b), min(a, b)
            q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
            res, rel = a - b, f"{a} - {b} = {a - b}"
        reasoning = f"{name} starts with {a} {item}. " + ("Getting more means adding" if "more" in q else "Giving away means subtracting") + f": {rel}."
        ans = f"{name} has {res} {item}." if "more" in q else f"{res} {item} are left."
    # Without reasoning the answer must come straight away; keep both forms.
    reasoning = reasoning if rng.random() < 0.75 else ""
    return conv("arith", maybe_system(rng, [{"role": "user", "content": noisy(rng, q)}, assistant(ans, reasoning)]))


# ---------------------------------------------------------------------------------------------
# Tools: each entry is (schema, request generator). A request generator returns
# (user text, arguments, tool result, final answer).

def tool(name, description, props, required):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


def s(desc, **kw):
    return {"type": "string", "description": desc, **kw}


def n(desc, kind="number"):
    return {"type": kind, "description": desc}


FILES = ["src/main.rs", "README.md", "setup.py", "app/models.py", "docs/index.md", "Cargo.toml",
         "tests/test_api.py", "config.yaml", "lib/utils.js", "notes.txt", "src/server/routes.rs"]
WORDS = ["TODO", "fixme", "deprecated", "unwrap()", "import os", "def main", "async fn", "error", "timeout"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"]
LANGS = ["French", "German", "Spanish", "Italian", "Japanese", "Portuguese"]
CONDITIONS = ["sunny", "cloudy", "light rain", "snow", "windy", "foggy", "clear"]
STOCKS = ["AAPL", "MSFT", "NVDA", "GOOG", "AMZN", "TSLA", "IBM", "ORCL"]


def req_weather(rng):
    city = rng.choice(CITIES)
    unit = rng.choice(["celsius", "fahrenheit"])
    temp = rng.randrange(-5, 35) if unit == "celsius" else rng.randrange(25, 95)
    cond = rng.choice(CONDITIONS)
    args = {"city": city}
    if rng.random() < 0.5:
        args["unit"] = unit
        q = rng.choice([f"What's the weather in {city} in {unit}?", f"Weather for {city}, please, in {unit}."])
    else:
        unit = "celsius"
        q = rng.choice([f"What's the weather like in {city}?", f"Is it cold in {city} right now?",
                        f"weather {city}", f"How warm is it in {city} today?"])
    result = {"city": city, "temperature": temp, "unit": unit, "condition": cond}
    deg = "°C" if unit == "celsius" else "°F"
    return q, args, result, f"It is {temp}{deg} and {cond} in {city}."


def req_read_file(rng):
    path = rng.choice(FILES)
    q = rng.choice([f"Show me {path}.", f"Read the file {path}.", f"What's in {path}?", f"Open {path} for me."])
    lines = rng.randrange(3, 400)
    return q, {"path": path}, {"path": path, "lines": lines, "content": "..."}, f"{path} has {lines} lines; its content is above."


def req_search(rng):
    pat, d = rng.choice(WORDS), rng.choice(["src", ".", "app", "tests", "lib"])
    q = rng.choice([f"Find every \"{pat}\" in {d}.", f"Search for {pat} under {d}.", f"Where do we use {pat} in {d}?"])
    hits = rng.randrange(0, 9)
    files = rng.sample(FILES, min(hits, 3))
    ans = (f"\"{pat}\" appears {hits} times in {d}" + (", in " + ", ".join(files) + "." if files else ".")) if hits else f"No matches for \"{pat}\" in {d}."
    return q, {"pattern": pat, "path": d}, {"matches": hits, "files": files}, ans


def req_run(rng):
    cmd = rng.choice(["cargo test", "ls -la", "git status", "pytest -q", "npm run build", "make", "cargo build --release",
                      "python3 main.py", "git log --oneline -5"])
    q = rng.choice([f"Run `{cmd}`.", f"Please run {cmd}.", f"Can you execute {cmd} for me?"])
    code = rng.choice([0, 0, 0, 1, 2])
    ans = f"`{cmd}` finished successfully." if code == 0 else f"`{cmd}` failed with exit code {code}."
    return q, {"command": cmd}, {"exit_code": code, "stdout": "...", "stderr": "" if code == 0 else "error"}, ans


def req_currency(rng):
    a, b = rng.sample(CURRENCIES, 2)
    amount = rng.choice([rng.randrange(1, 1000), rng.randrange(1, 100) * 10])
    rate = round(rng.uniform(0.5, 1.6), 4) if "JPY" not in (a, b) else round(rng.uniform(0.006, 160), 3)
    out = round(amount * rate, 2)
    q = rng.choice([f"Convert {amount} {a} to {b}.", f"How much is {amount} {a} in {b}?", f"{amount} {a} in {b}?"])
    return q, {"amount": amount, "from": a, "to": b}, {"amount": amount, "from": a, "to": b, "result": out}, f"{amount} {a} is {out} {b}."


def req_translate(rng):
    text = rng.choice(["Good morning", "Thank you very much", "Where is the station?", "I like coffee",
                       "See you tomorrow", "How much does it cost?"])
    lang = rng.choice(LANGS)
    q = rng.choice([f"Translate \"{text}\" into {lang}.", f"How do you say \"{text}\" in {lang}?"])
    return q, {"text": text, "target_language": lang}, {"translation": "<translated text>"}, f"In {lang}: <translated text>."


def req_event(rng):
    title = rng.choice(["Team sync", "Dentist", "Lunch with " + rng.choice(NAMES), "Project review", "Gym", "Call mom"])
    day = rng.randrange(1, 29)
    month = rng.randrange(1, 13)
    hour = rng.randrange(8, 19)
    date = f"2026-{month:02d}-{day:02d}"
    q = rng.choice([f"Add \"{title}\" to my calendar on {date} at {hour}:00.", f"Schedule {title} for {date}, {hour}:00."])
    args = {"title": title, "date": date, "time": f"{hour:02d}:00"}
    return q, args, {"status": "created", "id": rng.randrange(1000, 9999)}, f"Done: \"{title}\" is on your calendar for {date} at {hour:02d}:00."


def req_email(rng):
    to = rng.choice(NAMES).lower() + "@example.com"
    subject = rng.choice(["Meeting notes", "Invoice", "Quick question", "Weekend plans", "Release 1.2"])
    q = rng.choice([f"Send an email to {to} with the subject \"{subject}\" saying I'll be late.",
                    f"Email {to}: subject \"{subject}\", body: I'll be late."])
    args = {"to": to, "subject": subject, "body": "I'll be late."}
    return q, args, {"status": "sent"}, f"Your email \"{subject}\" was sent to {to}."


def req_stock(rng):
    sym = rng.choice(STOCKS)
    price = round(rng.uniform(20, 900), 2)
    q = rng.choice([f"What's the price of {sym}?", f"{sym} stock price?", f"How is {sym} trading?"])
    return q, {"symbol": sym}, {"symbol": sym, "price": price, "currency": "USD"}, f"{sym} is trading at ${price}."


def req_timezone(rng):
    city = rng.choice(CITIES)
    h, m = rng.randrange(24), rng.randrange(60)
    q = rng.choice([f"What time is it in {city}?", f"Current time in {city}?"])
    return q, {"city": city}, {"city": city, "time": f"{h:02d}:{m:02d}"}, f"It is {h:02d}:{m:02d} in {city}."


def req_todo(rng):
    task = rng.choice(["buy milk", "fix the login bug", "call the plumber", "write the report", "book flights",
                       "review PR 42", "water the plants"])
    prio = rng.choice(["low", "medium", "high"])
    if rng.random() < 0.5:
        q, args = f"Add \"{task}\" to my todo list with {prio} priority.", {"task": task, "priority": prio}
    else:
        q, args = rng.choice([f"Remind me to {task}.", f"Add {task} to my todos."]), {"task": task}
    return q, args, {"status": "added", "count": rng.randrange(1, 20)}, f"Added \"{task}\" to your todo list."


def req_calc(rng):
    a, b = rng.randrange(100, 10000), rng.randrange(2, 500)
    op = rng.choice(["*", "/", "+", "-"])
    expr = f"{a} {op} {b}"
    val = {"*": a * b, "/": round(a / b, 4), "+": a + b, "-": a - b}[op]
    q = rng.choice([f"Use the calculator: {expr}", f"Calculate {expr} precisely.", f"Evaluate {expr} with the calculator."])
    return q, {"expression": expr}, {"result": val}, f"{expr} = {val}."


def req_wiki(rng):
    topic = rng.choice(["Rust (programming language)", "Alan Turing", "Photosynthesis", "The Moon", "Volcanoes",
                        "Ada Lovelace", "Linux", "Jazz", "Honey bees"])
    q = rng.choice([f"Look up {topic} on Wikipedia.", f"Search Wikipedia for {topic}.", f"Find a summary of {topic}."])
    return q, {"query": topic}, {"title": topic, "summary": "<summary text>"}, f"Here is what Wikipedia says about {topic}: <summary text>."


def req_list_dir(rng):
    d = rng.choice(["src", ".", "tests", "docs", "crates", "app"])
    names = rng.sample(["main.rs", "lib.rs", "mod.rs", "README.md", "utils.py", "index.md", "config.toml", "api.rs"], 3)
    q = rng.choice([f"List the files in {d}.", f"What's inside the {d} directory?", f"ls {d}"])
    return q, {"path": d}, {"entries": names}, f"{d} contains " + ", ".join(names) + "."


def req_write_file(rng):
    path = rng.choice(["notes.txt", "hello.py", "TODO.md", "out/result.json", "src/lib.rs"])
    content = rng.choice(["hello world", "print('hi')", "- [ ] ship it", "{\"ok\": true}", "pub fn answer() -> u32 { 42 }"])
    q = f"Write \"{content}\" to {path}."
    return q, {"path": path, "content": content}, {"status": "written", "bytes": len(content)}, f"Wrote {len(content)} bytes to {path}."


def req_flights(rng):
    a, b = rng.sample(CITIES, 2)
    day = f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    q = rng.choice([f"Find flights from {a} to {b} on {day}.", f"Any flights {a} to {b} on {day}?"])
    price = rng.randrange(80, 1200)
    return q, {"origin": a, "destination": b, "date": day}, {"flights": [{"price": price, "currency": "EUR"}]}, f"The cheapest flight from {a} to {b} on {day} costs {price} EUR."


def req_git_commit(rng):
    msg = rng.choice(["Fix typo in README", "Add tests for the parser", "Bump version to 1.2.0", "Refactor routes"])
    q = rng.choice([f"Commit everything with the message \"{msg}\".", f"git commit -am \"{msg}\" please"])
    return q, {"message": msg}, {"commit": "%07x" % rng.randrange(16 ** 7)}, f"Committed: \"{msg}\"."


def req_restaurant(rng):
    city, cuisine = rng.choice(CITIES), rng.choice(["italian", "japanese", "mexican", "indian", "vegan", "thai"])
    q = rng.choice([f"Find a {cuisine} restaurant in {city}.", f"Where can I eat {cuisine} food in {city}?"])
    name = rng.choice(["Luna", "Sakura", "El Sol", "Masala House", "Green Leaf", "Bangkok Garden"])
    return q, {"city": city, "cuisine": cuisine}, {"results": [{"name": name, "rating": round(rng.uniform(3.5, 5), 1)}]}, f"Try {name} in {city}."


def req_timer(rng):
    mins = rng.randrange(1, 90)
    q = rng.choice([f"Set a timer for {mins} minutes.", f"Timer {mins} min please."])
    return q, {"minutes": mins}, {"status": "started"}, f"Timer set for {mins} minutes."


def req_unit(rng):
    v = rng.randrange(1, 500)
    a, b = rng.choice([("miles", "kilometers"), ("pounds", "kilograms"), ("inches", "centimeters"), ("liters", "gallons")])
    q = f"Convert {v} {a} to {b}."
    factor = {"miles": 1.609344, "pounds": 0.45359237, "inches": 2.54, "liters": 0.264172}[a]
    out = round(v * factor, 2)
    return q, {"value": v, "from_unit": a, "to_unit": b}, {"result": out}, f"{v} {a} is {out} {b}."


TOOLS = [
    (tool("get_weather", "Get the current weather for a city.",
          {"city": s("City name, e.g. Paris"), "unit": s("Temperature unit", enum=["celsius", "fahrenheit"])}, ["city"]), req_weather),
    (tool("read_file", "Read a text file from the workspace.", {"path": s("Path of the file")}, ["path"]), req_read_file),
    (tool("search_files", "Search the workspace for a text pattern.",
          {"pattern": s("Text or regex to look for"), "path": s("Directory to search in")}, ["pattern", "path"]), req_search),
    (tool("run_command", "Run a shell command in the workspace and return its output.", {"command": s("The command line")}, ["command"]), req_run),
    (tool("convert_currency", "Convert an amount of money between currencies.",
          {"amount": n("Amount to convert"), "from": s("ISO code of the source currency"), "to": s("ISO code of the target currency")},
          ["amount", "from", "to"]), req_currency),
    (tool("translate", "Translate text into another language.",
          {"text": s("Text to translate"), "target_language": s("Language to translate into")}, ["text", "target_language"]), req_translate),
    (tool("create_event", "Create a calendar event.",
          {"title": s("Event title"), "date": s("Date, YYYY-MM-DD"), "time": s("Start time, HH:MM")}, ["title", "date"]), req_event),
    (tool("send_email", "Send an email.",
          {"to": s("Recipient address"), "subject": s("Subject line"), "body": s("Message body")}, ["to", "subject", "body"]), req_email),
    (tool("get_stock_price", "Get the latest price of a stock.", {"symbol": s("Ticker symbol")}, ["symbol"]), req_stock),
    (tool("get_time", "Get the current local time in a city.", {"city": s("City name")}, ["city"]), req_timezone),
    (tool("add_todo", "Add a task to the todo list.",
          {"task": s("What to do"), "priority": s("Priority", enum=["low", "medium", "high"])}, ["task"]), req_todo),
    (tool("calculator", "Evaluate an arithmetic expression exactly.", {"expression": s("Expression such as 12 * 7")}, ["expression"]), req_calc),
    (tool("search_wikipedia", "Search Wikipedia and return a summary.", {"query": s("Search terms")}, ["query"]), req_wiki),
    (tool("list_directory", "List the entries of a directory.", {"path": s("Directory path")}, ["path"]), req_list_dir),
    (tool("write_file", "Write text to a file, replacing its content.",
          {"path": s("Path of the file"), "content": s("Text to write")}, ["path", "content"]), req_write_file),
    (tool("search_flights", "Search flights between two cities.",
          {"origin": s("Departure city"), "destination": s("Arrival city"), "date": s("Date, YYYY-MM-DD")},
          ["origin", "destination", "date"]), req_flights),
    (tool("git_commit", "Commit all staged and unstaged changes.", {"message": s("Commit message")}, ["message"]), req_git_commit),
    (tool("find_restaurant", "Find restaurants in a city.",
          {"city": s("City"), "cuisine": s("Kind of food")}, ["city"]), req_restaurant),
    (tool("set_timer", "Start a countdown timer.", {"minutes": n("Duration in minutes", "integer")}, ["minutes"]), req_timer),
    (tool("convert_units", "Convert a value between units of measurement.",
          {"value": n("Value to convert"), "from_unit": s("Unit of the value"), "to_unit": s("Unit to convert to")},
          ["value", "from_unit", "to_unit"]), req_unit),
]


# The same capability under other names: the model has to read the offered list instead of
# learning one name per kind of request.
NAME_ALIASES = {
    "get_weather": ["weather", "current_weather", "fetch_weather", "weather_lookup"],
    "read_file": ["open_file", "cat", "view_file", "file_read"],
    "search_files": ["grep", "find_in_files", "code_search"],
    "run_command": ["bash", "shell", "exec", "run_shell"],
    "convert_currency": ["currency_convert", "fx_convert", "exchange"],
    "translate": ["translate_text", "translator"],
    "create_event": ["add_event", "calendar_add", "schedule_event"],
    "send_email": ["email", "send_mail", "mail_send"],
    "get_stock_price": ["stock_quote", "get_quote", "stock_price"],
    "get_time": ["current_time", "time_in", "world_clock"],
    "add_todo": ["todo_add", "create_task", "add_task"],
    "calculator": ["calc", "evaluate", "math_eval"],
    "search_wikipedia": ["wikipedia", "wiki_search", "lookup_wiki"],
    "list_directory": ["ls", "list_files", "dir_list"],
    "write_file": ["save_file", "file_write", "create_file"],
    "search_flights": ["find_flights", "flight_search"],
    "git_commit": ["commit", "commit_changes"],
    "find_restaurant": ["restaurant_search", "find_food"],
    "set_timer": ["timer", "start_timer", "countdown"],
    "convert_units": ["unit_convert", "convert"],
}
PARAM_ALIASES = {
    "city": ["location", "place", "city_name"], "path": ["file_path", "filename", "target"],
    "pattern": ["query", "regex", "needle"], "command": ["cmd", "script"], "text": ["input", "source_text"],
    "query": ["q", "search", "terms"], "task": ["title", "item"], "expression": ["expr", "formula"],
    "symbol": ["ticker"], "message": ["msg", "commit_message"], "minutes": ["duration", "mins"],
    "to": ["recipient", "address"], "content": ["text", "data"],
}


def variant(rng, schema, args_list):
    """The schema under another tool name and parameter names (half the time), and the
    arguments renamed to match."""
    if rng.random() < 0.5:
        return schema, args_list
    f = schema["function"]
    name = rng.choice(NAME_ALIASES.get(f["name"], [f["name"]]))
    props = f["parameters"]["properties"]
    rename = {}
    for p in props:
        alias = rng.choice(PARAM_ALIASES.get(p, []) + [p])
        if alias != p and (alias in props or alias in rename.values()):
            alias = p
        rename[p] = alias
    new = {"type": "function", "function": {
        "name": name, "description": f["description"],
        "parameters": {"type": "object", "properties": {rename[p]: v for p, v in props.items()},
                       "required": [rename[p] for p in f["parameters"]["required"]]}}}
    return new, [{rename[k]: v for k, v in a.items()} for a in args_list]


def offered_tools(rng, k, schema):
    """The right tool among 0..4 others (each possibly renamed), shuffled."""
    others = rng.sample([i for i in range(len(TOOLS)) if i != k], rng.randrange(0, 5))
    tools = [variant(rng, TOOLS[i][0], [])[0] for i in others] + [schema]
    rng.shuffle(tools)
    return tools


def noisy(rng, text):
    """Users type carelessly: sometimes lower-case, sometimes without the final punctuation."""
    if rng.random() < 0.15:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.15 and text[-1] in ".?!":
        text = text[:-1]
    return text


def gen_tool(rng):
    k = rng.randrange(len(TOOLS))
    q, args, result, final = TOOLS[k][1](rng)
    schema, (args,) = variant(rng, TOOLS[k][0], [args])
    tools = offered_tools(rng, k, schema)
    q = noisy(rng, q)
    name = schema["function"]["name"]
    reasoning = rng.choice([
        f"The user wants something that the {name} tool can do. I'll call it with the right arguments.",
        f"I should call {name}.", "",
    ])
    pre = "" if rng.random() < 0.85 else rng.choice(["Let me check.", "I'll look that up.", "On it."])
    messages = [{"role": "user", "content": q}, assistant(pre, reasoning, [(name, args)])]
    # Most conversations continue with the tool result and the final answer; some stop at the
    # call (what a model sees when it has to make one).
    if rng.random() < 0.8:
        messages.append({"role": "tool", "content": json.dumps(result, ensure_ascii=False)})
        r2 = rng.choice(["", f"The tool returned the result. I'll summarise it for the user."])
        messages.append(assistant(final, r2))
    return conv("tool", maybe_system(rng, messages, 0.4), tools)


def gen_tool_parallel(rng):
    """Two calls of the same tool in one turn (weather in two cities, two files...)."""
    k = rng.choice([0, 1, 8, 9])
    schema, req = TOOLS[k]
    (q1, a1, r1, f1), (q2, a2, r2, f2) = req(rng), req(rng)
    if a1 == a2:
        return gen_tool(rng)
    schema, (a1, a2) = variant(rng, schema, [a1, a2])
    name = schema["function"]["name"]
    key = schema["function"]["parameters"]["required"][0]
    q = rng.choice([f"{q1} Also: {q2}", f"Two things. {q1} And {q2[0].lower() + q2[1:]}"])
    messages = [{"role": "user", "content": q},
                assistant("", f"Two requests: I'll call {name} twice, for {a1[key]} and for {a2[key]}.", [(name, a1), (name, a2)]),
                {"role": "tool", "content": json.dumps(r1, ensure_ascii=False)},
                {"role": "tool", "content": json.dumps(r2, ensure_ascii=False)},
                assistant(f"{f1} {f2}", "")]
    return conv("tool", messages, offered_tools(rng, k, schema))


def gen_tool_unneeded(rng):
    """Tools are offered but the question needs none: answer normally."""
    tools = [variant(rng, t, [])[0] for t, _ in rng.sample(TOOLS, rng.randrange(1, 4))]
    inner = rng.choice([gen_fact, gen_arith, gen_smalltalk])(rng)
    msgs = [m for m in inner["messages"] if m["role"] != "system"]
    return conv("tool_none", msgs, tools)


# ---------------------------------------------------------------------------------------------
# JSON answers that follow a schema given in the prompt.

def gen_json(rng):
    kind = rng.randrange(4)
    if kind == 0:
        name, age, city = rng.choice(NAMES), rng.randrange(18, 90), rng.choice(CITIES)
        text = rng.choice([f"{name} is {age} years old and lives in {city}.", f"Meet {name} from {city}, aged {age}.",
                           f"{name}, {age}, {city}."])
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                   "city": {"type": "string"}}, "required": ["name", "age", "city"]}
        value = {"name": name, "age": age, "city": city}
    elif kind == 1:
        product = rng.choice(["laptop", "keyboard", "desk lamp", "coffee mug", "backpack", "monitor", "headphones"])
        price = round(rng.uniform(5, 1500), 2)
        stock = rng.randrange(0, 50)
        text = f"The {product} costs ${price} and we have {stock} in stock."
        schema = {"type": "object", "properties": {"product": {"type": "string"}, "price": {"type": "number"},
                                                   "stock": {"type": "integer"}}, "required": ["product", "price", "stock"]}
        value = {"product": product, "price": price, "stock": stock}
    elif kind == 2:
        people = rng.sample(NAMES, rng.randrange(1, 4))
        title = rng.choice(["Planning meeting", "Code review", "Birthday party", "Book club", "Standup"])
        date = f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        text = f"{title} on {date} with " + ", ".join(people) + "."
        schema = {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
                                                   "attendees": {"type": "array", "items": {"type": "string"}}},
                  "required": ["title", "date", "attendees"]}
        value = {"title": title, "date": date, "attendees": people}
    else:
        country, city = rng.choice(list(CAPITALS.items()))
        text = f"The capital of {country}."
        schema = {"type": "object", "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
                  "required": ["country", "capital"]}
        value = {"country": country, "capital": city}
    schema_text = json.dumps(schema, ensure_ascii=False)
    q = rng.choice([
        f"Extract the data as JSON matching this schema: {schema_text}\n\nText: {text}",
        f"{text}\n\nReply with JSON only, following this schema: {schema_text}",
        f"Return a JSON object for: {text}\nSchema: {schema_text}",
    ])
    indent = rng.choice([None, None, 2])
    answer = json.dumps(value, ensure_ascii=False, indent=indent)
    reasoning = rng.choice(["", "I need to fill in every required field of the schema from the text."])
    return conv("json", maybe_system(rng, [{"role": "user", "content": q}, assistant(answer, reasoning)]))


# ---------------------------------------------------------------------------------------------
# Code: Python functions of the standard library, asked for by their docstring.

_FUNCTIONS = None


def stdlib_functions():
    """Functions and methods of the stdlib with a docstring, 4..50 lines: (module, name, signature, summary, source)."""
    global _FUNCTIONS
    if _FUNCTIONS is not None:
        return _FUNCTIONS
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "idlelib", "site-packages", "__pycache__",
                                                              "lib2to3", "turtledemo", "ensurepip", "tkinter"))
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            try:
                src = open(path, encoding="utf-8").read()
                tree = ast.parse(src)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            lines = src.splitlines()
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            nodes = [(module, n) for n in tree.body]
            nodes += [(f"{module}.{c.name}", n) for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body]
            for owner, node in nodes:
                if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node)
                if not doc or node.decorator_list:
                    continue
                body = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
                if not 4 <= body.count("\n") + 1 <= 50 or any(len(l) > 100 for l in body.splitlines()):
                    continue
                summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
                summary = " ".join(summary.split())
                if not 10 <= len(summary) <= 200:
                    continue
                sig = f"{node.name}({ast.unparse(node.args)})"
                out.append((owner, node.name, sig, summary, body))
    _FUNCTIONS = out
    return out


def gen_code(rng):
    funcs = stdlib_functions()
    module, name, sig, summary, source = rng.choice(funcs)
    s0 = summary[0].lower() + summary[1:] if summary[:2] != summary[:2].upper() else summary
    q = rng.choice([
        f"Write a Python function `{sig}`. {summary}",
        f"Implement `{name}` in Python: {s0}",
        f"Can you write a Python function called {name} that does this? {summary}",
        f"Show me how Python's `{module}` implements {name}.",
    ])
    intro = rng.choice(["", "Here is the function:\n\n", f"This is `{name}` from `{module}`:\n\n"])
    answer = f"{intro}```python\n{source}\n```"
    reasoning = rng.choice(["", f"I'll write {name} with a docstring, keeping it short."])
    return conv("code", maybe_system(rng, [{"role": "user", "content": q}, assistant(answer, reasoning)]))


# Small programming tasks with canonical solutions, names varied: code a tiny model can
# learn to compose rather than recite.
PY_TASKS = [
    ("returns the sum of a list of numbers", "sum_list", ["numbers", "values", "xs"],
     "def {f}({a}):\n    total = 0\n    for x in {a}:\n        total += x\n    return total"),
    ("returns the largest number in a list", "max_value", ["numbers", "values", "items"],
     "def {f}({a}):\n    best = {a}[0]\n    for x in {a}[1:]:\n        if x > best:\n            best = x\n    return best"),
    ("reverses a string", "reverse_string", ["s", "text", "word"], "def {f}({a}):\n    return {a}[::-1]"),
    ("checks whether a number is even", "is_even", ["n", "x", "number"], "def {f}({a}):\n    return {a} % 2 == 0"),
    ("computes the factorial of n", "factorial", ["n", "k"],
     "def {f}({a}):\n    result = 1\n    for i in range(2, {a} + 1):\n        result *= i\n    return result"),
    ("returns the n-th Fibonacci number", "fibonacci", ["n", "k"],
     "def {f}({a}):\n    a, b = 0, 1\n    for _ in range({a}):\n        a, b = b, a + b\n    return a"),
    ("counts the vowels in a string", "count_vowels", ["s", "text", "word"],
     "def {f}({a}):\n    return sum(1 for c in {a}.lower() if c in \"aeiou\")"),
    ("returns the greatest common divisor of two integers", "gcd", ["a, b", "x, y", "m, n"],
     "def {f}({a}):\n    {p0}, {p1} = abs({p0}), abs({p1})\n    while {p1}:\n        {p0}, {p1} = {p1}, {p0} % {p1}\n    return {p0}"),
    ("checks whether a number is prime", "is_prime", ["n", "x", "number"],
     "def {f}({a}):\n    if {a} < 2:\n        return False\n    i = 2\n    while i * i <= {a}:\n        if {a} % i == 0:\n            return False\n        i += 1\n    return True"),
    ("converts Celsius to Fahrenheit", "celsius_to_fahrenheit", ["c", "celsius", "degrees"],
     "def {f}({a}):\n    return {a} * 9 / 5 + 32"),
    ("returns the average of a list of numbers", "average", ["numbers", "values", "xs"],
     "def {f}({a}):\n    if not {a}:\n        return 0.0\n    return sum({a}) / len({a})"),
    ("counts the words in a sentence", "word_count", ["sentence", "text", "s"], "def {f}({a}):\n    return len({a}.split())"),
    ("checks whether a string is a palindrome", "is_palindrome", ["s", "text", "word"],
     "def {f}({a}):\n    cleaned = {a}.lower().replace(\" \", \"\")\n    return cleaned == cleaned[::-1]"),
    ("removes duplicates from a list while keeping the order", "unique", ["items", "values", "xs"],
     "def {f}({a}):\n    seen = set()\n    out = []\n    for x in {a}:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out"),
    ("flattens a list of lists", "flatten", ["lists", "nested", "rows"],
     "def {f}({a}):\n    return [x for sub in {a} for x in sub]"),
    ("counts how often each word appears in a text", "word_frequencies", ["text", "s", "document"],
     "def {f}({a}):\n    counts = {{}}\n    for word in {a}.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts"),
    ("returns the squares of the numbers in a list", "squares", ["numbers", "values", "xs"],
     "def {f}({a}):\n    return [x * x for x in {a}]"),
    ("returns only the even numbers of a list", "evens", ["numbers", "values", "xs"],
     "def {f}({a}):\n    return [x for x in {a} if x % 2 == 0]"),
    ("capitalizes every word of a string", "title_case", ["s", "text", "sentence"],
     "def {f}({a}):\n    return \" \".join(w.capitalize() for w in {a}.split())"),
    ("reads a text file and returns its lines", "read_lines", ["path", "filename", "file_path"],
     "def {f}({a}):\n    with open({a}, encoding=\"utf-8\") as f:\n        return f.read().splitlines()"),
    ("sorts a list of dictionaries by a key", "sort_by_key", ["items, key", "rows, key", "records, field"],
     "def {f}({a}):\n    return sorted({p0}, key=lambda d: d[{p1}])"),
    ("returns the n largest numbers of a list", "top_n", ["numbers, n", "values, k", "xs, n"],
     "def {f}({a}):\n    return sorted({p0}, reverse=True)[:{p1}]"),
    ("checks whether two strings are anagrams", "is_anagram", ["a, b", "s, t", "first, second"],
     "def {f}({a}):\n    return sorted({p0}.lower()) == sorted({p1}.lower())"),
    ("computes the power of a number with a loop", "power", ["base, exp", "x, n", "b, e"],
     "def {f}({a}):\n    result = 1\n    for _ in range({p1}):\n        result *= {p0}\n    return result"),
]
RUST_TASKS = [
    ("adds two integers", "add", "fn {f}(a: i64, b: i64) -> i64 {{\n    a + b\n}}"),
    ("checks whether a number is even", "is_even", "fn {f}(n: u64) -> bool {{\n    n % 2 == 0\n}}"),
    ("computes the factorial of n", "factorial", "fn {f}(n: u64) -> u64 {{\n    (1..=n).product()\n}}"),
    ("returns the sum of a slice of numbers", "sum", "fn {f}(values: &[i64]) -> i64 {{\n    values.iter().sum()\n}}"),
    ("reverses a string", "reverse", "fn {f}(s: &str) -> String {{\n    s.chars().rev().collect()\n}}"),
    ("returns the largest value of a slice", "largest", "fn {f}(values: &[i64]) -> Option<i64> {{\n    values.iter().copied().max()\n}}"),
    ("counts the words in a string", "word_count", "fn {f}(s: &str) -> usize {{\n    s.split_whitespace().count()\n}}"),
]


def gen_code_task(rng):
    if rng.random() < 0.8:
        what, fname, argsets, body = rng.choice(PY_TASKS)
        args = rng.choice(argsets)
        parts = [x.strip() for x in args.split(",")]
        f = rng.choice([fname, fname, "solve", "my_" + fname, fname.replace("_", "")])
        code = body.format(f=f, a=args, p0=parts[0], p1=parts[-1])
        lang, q = "python", rng.choice([
            f"Write a Python function that {what}.", f"Write a Python function `{f}` that {what}.",
            f"python function that {what}?", f"Can you write a function in Python which {what}?",
            f"Implement {f}({args}) in Python: it {what}."])
    else:
        what, fname, body = rng.choice(RUST_TASKS)
        f = rng.choice([fname, "solve"])
        code = body.format(f=f)
        lang, q = "rust", rng.choice([f"Write a Rust function that {what}.", f"In Rust, write `{f}`, which {what}."])
    intro = rng.choice(["", "Here it is:\n\n", "Here is a simple version:\n\n"])
    answer = f"{intro}```{lang}\n{code}\n```"
    reasoning = rng.choice(["", f"A short function that {what} is enough."])
    return conv("code_task", maybe_system(rng, [{"role": "user", "content": q}, assistant(answer, reasoning)]))


# ---------------------------------------------------------------------------------------------

def gen_multiturn(rng):
    """Two or three simple exchanges in one conversation."""
    msgs = []
    for _ in range(rng.randrange(2, 4)):
        c = rng.choice([gen_fact, gen_arith, gen_smalltalk, gen_json])(rng)
        msgs += [m for m in c["messages"] if m["role"] != "system"]
    return conv("multiturn", maybe_system(rng, msgs))


GENERATORS = [
    (gen_smalltalk, 4), (gen_fact, 14), (gen_arith, 18), (gen_tool, 22), (gen_tool_parallel, 4),
    (gen_tool_unneeded, 4), (gen_json, 12), (gen_code, 7), (gen_code_task, 9), (gen_multiturn, 8),
]


def generate(rng):
    """One conversation drawn from the mixture above."""
    fns, weights = zip(*GENERATORS)
    return rng.choices(fns, weights)[0](rng)


def render(conversation, template):
    """The training text of a conversation: the chat template applied to all its messages."""
    from transformers.utils.chat_template_utils import render_jinja_template
    text, _ = render_jinja_template(
        conversations=[conversation["messages"]], tools=conversation["tools"], chat_template=template)
    return text[0]
