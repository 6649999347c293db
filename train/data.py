"""Synthetic chat conversations for the demo model, in the message format of the chat template.

Every generator takes a `random.Random` and returns one conversation:
`{"kind": str, "messages": [...], "tools": [...] or None}`. Assistant messages carry
`reasoning_content` (possibly empty) so the template renders the think block; the rendered
text is the training text, so thinking-on and thinking-off prompts both occur in training.

Nothing here needs a network or a GPU; the only outside input is the Python standard
library's own source (for the code conversations), read from this interpreter's stdlib.
"""
import ast
import copy
import json
import os
import random
import re
import sysconfig
import textwrap
import unicodedata

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



def load_tokenizer(directory):
    """The `tokenizers` tokenizer of a model directory: `tokenizer.json`, or gzip-compressed as
    `tokenizer.json.gz` (how `models/demo` keeps it, as splash reads it)."""
    import gzip

    from tokenizers import Tokenizer

    plain = os.path.join(directory, "tokenizer.json")
    if os.path.exists(plain):
        return Tokenizer.from_file(plain)
    with gzip.open(plain + ".gz", "rt", encoding="utf-8") as f:
        return Tokenizer.from_str(f.read())

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

_GREETINGS = ["Hello!", "Hi!", "Hey there", "Hello", "hello", "hi", "hey", "Hey!", "Good morning!", "Good afternoon.",
              "Good evening!", "Hi, how are you?", "hello there", "Hi there!", "Howdy", "Greetings!", "yo", "hiya",
              "Hello, is anyone there?", "Morning!", "hey, how's it going?", "Hallo!", "Bonjour!", "Hola"]
_GREETING_REPLIES = [
    "Hello! How can I help you today?", "Hi! What can I do for you?", "Hello! I'm ready to help. What do you need?",
    "Hey! What would you like to know?", "Hi there! Ask me anything: a sum, a fact, a tool call or some JSON.",
    "Hello! What are we working on today?", "Hi! Nice to hear from you. How can I help?",
    "Good to see you! What can I do for you?", "Hello there! Do you have a question for me?",
    "Hi! I'm splash's demo model. What do you need?", "Hey there! How can I be useful?",
    "Hello! Tell me what you need and I'll do my best.", "Hi! I'm doing well, thanks. What can I help you with?",
    "Greetings! What would you like me to do?", "Hello! Need a calculation, a fact or a function?",
    "Hi! Happy to help. What's on your mind?", "Hey! Ready when you are.", "Hello! How is your day going?",
    "Hi! Ask away.", "Hello, I'm here. What can I do?", "Good day! How may I help you?",
    "Hi! Let me know what you'd like to do.",
]
_SMALLTALK = [
    (["Who are you?", "What are you?", "Introduce yourself.", "What is your name?", "who are you", "What's your name?",
      "Are you a bot?", "Tell me about yourself."],
     ["I'm the demo model of splash, a tiny language model trained to show how the server works. "
      "I can answer simple questions, do arithmetic, call tools, reply in JSON and write a little Python.",
      "I'm splash's demo model: a very small assistant. I can do simple arithmetic, call the tools you give me, "
      "answer in JSON and write short Python functions.",
      "I'm a small demo model that ships with splash. I know a few facts, add and multiply, call tools and write JSON.",
      "My name is splash demo. I'm a tiny model, so keep questions simple: sums, capitals, tools, JSON, short code."]),
    (["What can you do?", "How can you help me?", "What are you good at?", "what can you do", "Help",
      "What kind of questions can I ask?"],
     ["I can answer simple questions, do arithmetic step by step, call tools you give me, "
      "produce JSON that follows a schema and write short Python functions.",
      "Ask me for a sum or a product, a capital city, a chemical symbol, a small Python function, JSON that follows "
      "a schema, or give me tools and I'll call them.",
      "Simple things: arithmetic, short facts, tool calls, JSON answers and small functions in Python or Rust."]),
    (["Thanks!", "Thank you.", "Thanks a lot", "Great, thanks!", "thx", "thank you so much", "Cheers!",
      "Perfect, thank you."],
     ["You're welcome!", "Glad I could help!", "You're welcome. Anything else?", "No problem!", "Any time!",
      "Happy to help. Let me know if you need anything else.", "My pleasure!", "You're welcome, have a good day!"]),
    (["Bye!", "Goodbye.", "See you later", "bye", "Good night!", "That's all for now.", "Talk to you later."],
     ["Goodbye!", "See you later!", "Bye! Have a nice day.", "Take care!", "Good night!", "Bye for now!",
      "See you! Come back any time."]),
    (["How are you?", "How are you doing?", "how's it going", "How do you feel today?", "Are you okay?"],
     ["I'm fine, thanks for asking! How can I help?", "All good here. What can I do for you?",
      "I'm doing well. What would you like to know?", "Great, thank you! And you?",
      "I'm a small model, so every day is a good day. What do you need?"]),
    (["Tell me a joke.", "Say something funny.", "Do you know a joke?", "Make me laugh."],
     ["Why do programmers prefer dark mode? Because light attracts bugs.",
      "I would tell you a UDP joke, but you might not get it.",
      "There are 10 kinds of people: those who understand binary and those who don't.",
      "Why did the developer go broke? Because he used up all his cache.",
      "A SQL query walks into a bar, goes up to two tables and asks: may I join you?"]),
    (["Say hello", "Say hi", "Greet me.", "Say something."],
     ["Hello!", "Hi there!", "Hello, nice to meet you!", "Hey! How are you today?", "Hello! I'm splash's demo model.",
      "Hi! What shall we do?"]),
    (["Nice to meet you.", "I'm new here.", "First time using this."],
     ["Nice to meet you too! Ask me anything simple.", "Welcome! Try a sum, a capital city or a tool call.",
      "Hello and welcome! How can I help?"]),
    (["ok", "Okay.", "Cool", "I see.", "Got it."],
     ["Great! Anything else?", "Let me know if you need anything.", "Okay! What next?", "Sounds good."]),
]


def gen_smalltalk(rng):
    if rng.random() < 0.4:
        q, a = rng.choice(_GREETINGS), rng.choice(_GREETING_REPLIES)
    else:
        qs, answers = rng.choice(_SMALLTALK)
        q, a = rng.choice(qs), rng.choice(answers)
    reasoning = rng.choice(["", "", "", "The user is greeting me or making small talk. I'll answer politely.",
                            "Small talk: a short, friendly reply is enough."])
    return conv("smalltalk", maybe_system(rng, [{"role": "user", "content": noisy(rng, q)},
                                                  assistant(a, reasoning)]))


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


# Argument values. Each pool has a held-out part that training never uses (HELDOUT_*): the
# held-out evaluation (evaluate.py --tool-rate) asks with those values, with phrasings from
# HELDOUT_TEMPLATES and for the tools of HELDOUT_TOOLS, so it measures generalisation rather
# than recall. `split` ("train" or "heldout") selects the side everywhere below.

TRAIN_CITIES = CITIES + [
    "New York", "Los Angeles", "San Francisco", "Seattle", "Miami", "Houston", "Dallas", "Atlanta", "Phoenix",
    "Portland", "Austin", "Detroit", "Philadelphia", "Las Vegas", "Minneapolis", "Calgary", "Ottawa",
    "Quebec City", "Mexico City", "Guadalajara", "Bogota", "Medellín", "Caracas", "Buenos Aires", "São Paulo",
    "Rio de Janeiro", "Brasília", "Manchester", "Liverpool", "Glasgow", "Bristol", "Cardiff", "Belfast", "Cork",
    "Amsterdam", "Rotterdam", "Antwerp", "Brussels", "Lyon", "Toulouse", "Bordeaux", "Nantes", "Strasbourg",
    "Hamburg", "Frankfurt", "Stuttgart", "Düsseldorf", "Leipzig", "Dresden", "Munich", "Cologne", "Zurich",
    "Basel", "Bern", "Geneva", "Milan", "Turin", "Venice", "Bologna", "Barcelona", "Valencia", "Bilbao",
    "Málaga", "Budapest", "Bucharest", "Istanbul", "Ankara", "Izmir", "Beirut", "Amman", "Tel Aviv", "Dubai",
    "Abu Dhabi", "Doha", "Riyadh", "Tehran", "Karachi", "Lahore", "Delhi", "New Delhi", "Bangalore", "Chennai",
    "Kolkata", "Hyderabad", "Pune", "Shanghai", "Beijing", "Shenzhen", "Guangzhou", "Hong Kong", "Taipei",
    "Singapore", "Jakarta", "Ho Chi Minh City", "Manila", "Perth", "Brisbane", "Adelaide", "Wellington",
    "Christchurch", "Cape Town", "Johannesburg", "Durban", "Kinshasa", "Kampala", "Kigali", "Dar es Salaam",
    "Marrakesh", "Rabat", "Algiers", "Stockholm", "Copenhagen", "Bergen", "Tampere", "Reykjavik", "Kyiv",
    "Lviv", "Minsk", "Moscow", "Saint Petersburg", "Novosibirsk", "Vladivostok", "Anchorage", "Honolulu",
    "Havana", "San Juan", "Kingston", "Panama City", "San José", "Nice", "Hobart", "Yokohama", "Kobe",
    "Hiroshima", "Fukuoka", "Incheon", "Daegu", "Chengdu", "Wuhan", "Xi'an", "Lagos", "Abuja", "Addis Ababa",
    "Khartoum", "Tunis", "Tripoli", "Baghdad", "Kabul", "Tashkent", "Ulaanbaatar", "Yangon", "Phnom Penh",
    "Kuala Lumpur", "Dhaka", "Lima", "Arequipa", "Asunción", "Sucre", "Salt Lake City", "Nashville",
    "New Orleans", "Pittsburgh", "Cleveland", "Toledo", "Orlando", "Tampa", "San Diego", "Sacramento",
    "Winnipeg", "Halifax", "Edmonton",
    # as their own speakers write them
    "München", "Wien", "Roma", "Lisboa", "Zürich", "Kraków", "Tōkyō", "東京", "北京", "上海", "서울", "Köln",
    "Genève", "Praha", "Warszawa", "Moskva", "Москва", "Athína", "Αθήνα", "Bruxelles", "Den Haag", "København",
    "Göteborg", "Malmö", "Milano", "Torino", "Venezia", "Firenze", "Napoli", "Nürnberg", "Bogotá", "Ciudad de México",
    "Québec", "Montréal", "İstanbul", "Kyïv", "Beograd", "Bucureşti", "Delhi", "Al-Qāhira", "القاهرة", "Mumbai",
    "Łódź", "Wrocław", "Brno", "Plzeň", "Tartu", "Århus", "Jyväskylä",
]
HELDOUT_CITIES = [
    "Osaka", "大阪", "Kyoto", "京都", "Sapporo", "Nagoya", "Busan", "부산", "Marseille", "Porto", "Edinburgh",
    "Seville", "Sevilla", "Tbilisi", "Tallinn", "Vilnius", "Ljubljana", "Zagreb", "Salzburg", "Innsbruck",
    "Bratislava", "Gdańsk", "Poznań", "Tromsø", "Thessaloniki", "Θεσσαλονίκη", "Valparaíso", "Cusco",
    "Cartagena", "Oaxaca", "Mombasa", "Zanzibar", "Montevideo", "Quito", "Accra", "Dakar", "Kathmandu",
    "Colombo", "Almaty", "Auckland", "Vancouver", "Luxembourg", "Ghent", "Brugge", "Lausanne", "Lucerne",
    "Bergamo", "Palermo", "Granada", "Córdoba",
]
TRAIN_CITIES = sorted(set(TRAIN_CITIES), key=TRAIN_CITIES.index)

_SYLLABLES = ["ka", "lo", "mar", "ven", "to", "ri", "sa", "bel", "dor", "na", "vik", "ul", "ber", "gen", "sto",
              "ra", "mi", "len", "zan", "or", "pol", "te", "ash", "fen", "hol", "ter", "sel", "mon", "tri", "eva",
              "quin", "bra", "del", "kor", "us", "ith", "wal", "nor", "pe", "gra", "lin", "dun", "ves", "cal"]
_ENDINGS = ["", "", "", "burg", "ville", "ton", "ford", "polis", "grad", "stad", "heim", "port", "a", "ia", "o"]


def _key(text):
    """Lower case without accents: what makes two spellings of one name collide."""
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


_HELDOUT_KEYS = None


def leaks_heldout(text):
    """Whether a training value contains a held-out city (any spelling, any case)."""
    global _HELDOUT_KEYS
    if _HELDOUT_KEYS is None:
        _HELDOUT_KEYS = [_key(c) for c in HELDOUT_CITIES]
    k = _key(text)
    return any(h in k for h in _HELDOUT_KEYS)


def invented_city(rng):
    """A made-up place name: arguments the model can only copy from the request."""
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randrange(2, 4))) + rng.choice(_ENDINGS)
        name = name[0].upper() + name[1:]
        if rng.random() < 0.1:
            name = rng.choice(["Port ", "San ", "New ", "Saint ", "Bad ", "Nova "]) + name
        if not leaks_heldout(name) and name not in TRAIN_CITIES:
            return name


def city(rng, split):
    """Held out: a held-out city. Training: a known city one time in three, else a place made up
    here (the value can only be copied from the request, never recalled from the schema)."""
    if split == "heldout":
        return rng.choice(HELDOUT_CITIES)
    return rng.choice(TRAIN_CITIES) if rng.random() < 0.35 else invented_place(rng)


def cities(rng, split, k):
    out = []
    while len(out) < k:
        c = city(rng, split)
        if c not in out:
            out.append(c)
    return out


def pool(rng, split, train, heldout, invent=None, p=0.5):
    """A value from the split's list; in training, with `invent`, a made-up value with probability p
    (the held-out side draws exactly as before, so the held-out prompt set does not change)."""
    if split != "heldout" and invent is not None and rng.random() < p:
        return invent(rng)
    return rng.choice(heldout if split == "heldout" else train)


FILES = ["src/main.rs", "README.md", "setup.py", "app/models.py", "docs/index.md", "Cargo.toml",
         "tests/test_api.py", "config.yaml", "lib/utils.js", "notes.txt", "src/server/routes.rs",
         "package.json", "Makefile", "src/lib.rs", "index.html", "styles/main.css", "scripts/deploy.sh",
         "data/users.csv", "pyproject.toml", ".gitignore", "docs/setup.md", "src/app.ts", "go.mod", "main.go",
         "CHANGELOG.md", "LICENSE", "src/db/schema.sql", "config/settings.json", "Dockerfile", "app/views.py"]
HELDOUT_FILES = ["src/parser/lexer.rs", "web/public/robots.txt", "backend/handlers/auth.go", "infra/terraform.tfvars",
                 "notebooks/analysis.ipynb", "src/components/Navbar.tsx"]
_DIRS = ["src", "app", "lib", "docs", "tests", "scripts", "config", "data", "crates/core/src", "web", "tools"]
_STEMS = ["main", "utils", "config", "server", "client", "models", "routes", "api", "helpers", "index", "report",
          "todo", "notes", "build", "cache", "logger", "parser", "schema", "users", "orders"]
_EXTS = [".py", ".rs", ".js", ".ts", ".md", ".txt", ".json", ".yaml", ".toml", ".go", ".c", ".sh", ".csv"]


def file_path(rng, split):
    if split == "heldout":
        return rng.choice(HELDOUT_FILES)
    r = rng.random()
    if r < 0.35:
        return rng.choice(FILES)
    if r < 0.6:
        return invented_path(rng)
    while True:
        p = rng.choice(_STEMS) + rng.choice(_EXTS)
        if rng.random() < 0.7:
            p = rng.choice(_DIRS) + "/" + p
        if p not in HELDOUT_FILES:
            return p


WORDS = ["TODO", "fixme", "deprecated", "unwrap()", "import os", "def main", "async fn", "error", "timeout",
         "panic!", "console.log", "password", "http://", "XXX", "print(", "unsafe", "retry", "SELECT *"]
HELDOUT_WORDS = ["NotImplementedError", "localhost:8080", "@deprecated"]
COMMANDS = ["cargo test", "ls -la", "git status", "pytest -q", "npm run build", "make", "cargo build --release",
            "python3 main.py", "git log --oneline -5", "df -h", "npm install", "docker ps", "go test ./...",
            "cargo clippy", "git diff --stat", "uname -a", "du -sh .", "make clean", "pip list", "whoami"]
HELDOUT_COMMANDS = ["kubectl get pods", "terraform plan", "ruff check ."]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "DKK", "PLN", "INR", "CNY", "BRL",
              "MXN", "KRW", "ZAR", "NZD", "SGD", "HKD", "TRY"]
HELDOUT_CURRENCIES = ["CZK", "HUF", "THB", "ILS"]
LANGS = ["French", "German", "Spanish", "Italian", "Japanese", "Portuguese", "Dutch", "Polish", "Korean",
         "Chinese", "Russian", "Turkish", "Swedish", "Greek"]
HELDOUT_LANGS = ["Finnish", "Vietnamese", "Swahili"]
PHRASES = ["Good morning", "Thank you very much", "Where is the station?", "I like coffee", "See you tomorrow",
           "How much does it cost?", "The meeting is at noon", "Happy birthday", "I am lost", "Two tickets, please",
           "Where is the bathroom?", "The food was great"]
HELDOUT_PHRASES = ["My luggage did not arrive", "Is this seat taken?"]
CONDITIONS = ["sunny", "cloudy", "light rain", "snow", "windy", "foggy", "clear", "thunderstorms", "drizzle"]
STOCKS = ["AAPL", "MSFT", "NVDA", "GOOG", "AMZN", "TSLA", "IBM", "ORCL", "META", "INTC", "AMD", "CSCO", "KO",
          "PEP", "DIS", "V", "JPM", "BA", "NKE", "UBER"]
HELDOUT_STOCKS = ["NFLX", "ADBE", "SHOP"]
TASKS = ["buy milk", "fix the login bug", "call the plumber", "write the report", "book flights", "review PR 42",
         "water the plants", "renew my passport", "pay the electricity bill", "clean the garage", "send the invoice",
         "update the slides", "walk the dog", "back up the laptop"]
HELDOUT_TASKS = ["return the library books", "schedule a vet appointment"]
TOPICS = ["Rust (programming language)", "Alan Turing", "Photosynthesis", "The Moon", "Volcanoes", "Ada Lovelace",
          "Linux", "Jazz", "Honey bees", "Black holes", "The Roman Empire", "Marie Curie", "Climate change",
          "The printing press", "Mount Everest", "Penguins"]
HELDOUT_TOPICS = ["Plate tectonics", "Grace Hopper", "The Silk Road"]
EVENTS = ["Team sync", "Dentist", "Project review", "Gym", "Call mom", "Haircut", "Board meeting", "Yoga class",
          "Parent-teacher meeting", "Car service"]
HELDOUT_EVENTS = ["Piano lesson", "Quarterly planning"]
SUBJECTS = ["Meeting notes", "Invoice", "Quick question", "Weekend plans", "Release 1.2", "Holiday schedule",
            "Budget draft", "Welcome aboard"]
HELDOUT_SUBJECTS = ["Server outage", "Lunch on Friday"]
COMMITS = ["Fix typo in README", "Add tests for the parser", "Bump version to 1.2.0", "Refactor routes",
           "Remove dead code", "Update dependencies", "Handle empty input", "Improve error messages"]
HELDOUT_COMMITS = ["Add dark mode toggle", "Cache DNS lookups"]
CUISINES = ["italian", "japanese", "mexican", "indian", "vegan", "thai", "chinese", "french", "korean", "greek",
            "lebanese", "sushi", "pizza", "vegetarian"]
HELDOUT_CUISINES = ["ethiopian", "peruvian", "georgian"]


# Phrasings: TEMPLATES[key] for training, HELDOUT_TEMPLATES[key] never used in training (the
# first held-out weather phrasing is issue 30's). Questions, commands, indirect requests,
# polite forms, terse forms and a few in other languages.
TEMPLATES = {
    "weather": [
        "What's the weather like in {city}?", "What's the weather in {city}?", "How's the weather in {city}?",
        "What is the weather like in {city} today?", "Is it raining in {city}?", "Is it cold in {city} right now?",
        "How warm is it in {city} today?", "What's the temperature in {city}?",
        "What is the current temperature in {city}?", "Is it sunny in {city} at the moment?",
        "Do I need a jacket in {city} today?", "What are the weather conditions in {city} currently?",
        "Any rain in {city} today?", "How hot is it in {city}?", "Weather in {city} today?", "{city} weather?",
        "What's it like outside in {city} right now?", "Get the weather for {city}.", "Check the weather in {city}.",
        "Tell me the weather in {city}.", "Show me the current weather in {city}.",
        "Look up the weather in {city} for me.", "weather {city}", "Give me the weather report for {city}.",
        "Fetch the current conditions in {city}.", "I'm heading to {city} later, will I need an umbrella?",
        "I'm flying to {city} tonight. What's the weather there?",
        "Going for a walk in {city}, should I bring a coat?", "My sister lives in {city}. Is it snowing there today?",
        "I want to know the weather in {city}.", "I'd like to know how the weather is in {city}.",
        "Could you check the weather in {city}?", "Can you tell me the weather in {city} right now?",
        "Please get me the current weather for {city}.", "Would you look up today's weather in {city}?",
        "Is it windy in {city} today?", "What's the weather doing in {city}?", "How cold is it in {city} currently?",
        "current weather {city}", "Is it nice out in {city} today?", "What's the forecast for {city} today?",
        "Wie ist das Wetter in {city}?", "Quel temps fait-il à {city} ?", "¿Qué tiempo hace en {city}?",
    ],
    "weather_unit": [
        "What's the weather in {city} in {unit}?", "Weather for {city}, please, in {unit}.",
        "Temperature in {city} in {unit}?", "How warm is it in {city}? Give it in {unit}.",
        "Check the weather in {city} and use {unit}.", "Can you get the current weather in {city} in {unit}?",
        "I'm going to {city} today. What's the temperature there in {unit}?",
    ],
    "time": [
        "What time is it in {city}?", "Current time in {city}?", "What's the local time in {city}?",
        "Tell me the time in {city}.", "What's the time in {city} right now?", "Is it night in {city} now?",
        "I need to call a friend in {city}. What time is it there?", "time in {city}",
        "Can you check the current time in {city}?", "Get the local time for {city}.",
        "Is it too late to phone someone in {city} now?", "Could you tell me what time it is in {city}?",
        "Wie spät ist es in {city}?", "Quelle heure est-il à {city} ?",
    ],
    "restaurant": [
        "Find a {cuisine} restaurant in {city}.", "Where can I eat {cuisine} food in {city}?",
        "Any good {cuisine} places in {city}?", "I'm in {city} and hungry. Find me some {cuisine} food.",
        "Can you recommend a {cuisine} restaurant in {city}?", "Search for {cuisine} restaurants in {city}.",
    ],
    "flights": [
        "Find flights from {a} to {b} on {day}.", "Any flights {a} to {b} on {day}?",
        "I need to fly from {a} to {b} on {day}. What's available?", "Search flights {a} -> {b}, {day}.",
        "Can you look for flights from {a} to {b} on {day}?", "Show me flights between {a} and {b} on {day}.",
    ],
    "read_file": ["Show me {path}.", "Read the file {path}.", "What's in {path}?", "Open {path} for me.",
                  "Can you read {path}?", "cat {path}", "Print the contents of {path}.",
                  "I need to see what {path} contains."],
    "search": ["Find every \"{pat}\" in {d}.", "Search for {pat} under {d}.", "Where do we use {pat} in {d}?",
               "grep {pat} in {d}", "Look for \"{pat}\" in the {d} folder.", "Can you search {d} for {pat}?"],
    "run": ["Run `{cmd}`.", "Please run {cmd}.", "Can you execute {cmd} for me?", "Execute `{cmd}`.",
            "run {cmd}", "I need the output of `{cmd}`.", "Could you run `{cmd}` in the workspace?"],
    "currency": ["Convert {amount} {a} to {b}.", "How much is {amount} {a} in {b}?", "{amount} {a} in {b}?",
                 "What's {amount} {a} worth in {b}?", "Change {amount} {a} into {b}.",
                 "I have {amount} {a}. How many {b} is that?"],
    "translate": ["Translate \"{text}\" into {lang}.", "How do you say \"{text}\" in {lang}?",
                  "What is \"{text}\" in {lang}?", "Can you translate \"{text}\" to {lang}?",
                  "{lang} for \"{text}\"?"],
    "event": ["Add \"{title}\" to my calendar on {date} at {time}.", "Schedule {title} for {date}, {time}.",
              "Put {title} in my calendar on {date} at {time}.", "Create an event \"{title}\" on {date} at {time}.",
              "Can you book {title} on {date} at {time} in my calendar?"],
    "email": ["Send an email to {to} with the subject \"{subject}\" saying I'll be late.",
              "Email {to}: subject \"{subject}\", body: I'll be late.",
              "Write to {to} with subject \"{subject}\" and tell them I'll be late.",
              "Please mail {to} (subject: \"{subject}\") that I'll be late."],
    "stock": ["What's the price of {sym}?", "{sym} stock price?", "How is {sym} trading?",
              "Get me a quote for {sym}.", "How much is {sym} stock right now?", "Check {sym} for me."],
    "todo_prio": ["Add \"{task}\" to my todo list with {prio} priority.", "New {prio} priority task: {task}."],
    "todo": ["Remind me to {task}.", "Add {task} to my todos.", "Put \"{task}\" on my list.",
             "I must not forget to {task}. Add it to my tasks."],
    "calc": ["Use the calculator: {expr}", "Calculate {expr} precisely.", "Evaluate {expr} with the calculator.",
             "What is {expr} exactly? Use the calculator.", "Compute {expr} with the tool."],
    "wiki": ["Look up {topic} on Wikipedia.", "Search Wikipedia for {topic}.", "Find a summary of {topic}.",
             "What does Wikipedia say about {topic}?", "Get me the Wikipedia article on {topic}."],
    "list_dir": ["List the files in {d}.", "What's inside the {d} directory?", "ls {d}",
                 "Show me what is in the {d} folder.", "Which files are in {d}?"],
    "write_file": ["Write \"{content}\" to {path}.", "Save \"{content}\" into {path}.",
                   "Put the text \"{content}\" in {path}."],
    "commit": ["Commit everything with the message \"{msg}\".", "git commit -am \"{msg}\" please",
               "Commit my changes: \"{msg}\".", "Make a commit with message \"{msg}\"."],
    "timer": ["Set a timer for {mins} minutes.", "Timer {mins} min please.", "Start a {mins}-minute timer.",
              "Can you time {mins} minutes for me?", "Remind me in {mins} minutes with a timer."],
    "unit": ["Convert {v} {a} to {b}.", "How many {b} is {v} {a}?", "{v} {a} in {b}?",
             "What is {v} {a} in {b}?"],
}
HELDOUT_TEMPLATES = {
    "weather": [
        "What is the weather in {city} right now?",
        "Could you tell me what the weather is doing in {city} at the moment?",
        "I'm visiting {city} this afternoon. Should I pack sunglasses?",
        "Report the current weather conditions for {city}.", "How cold does it feel in {city} now?",
        "Is there a storm in {city} today?", "Please find out the temperature in {city}.",
        "Che tempo fa a {city}?", "Weather check: {city}, please.", "is it warm in {city} currently",
        "Need the weather for {city}, right now.", "Tell me whether it's raining in {city} today.",
    ],
    "weather_unit": ["Give me the current temperature in {city}, in {unit}."],
    "time": ["What hour is it currently in {city}?", "Do you know what time it is over in {city}?",
             "I have a meeting with someone in {city}; what's their local time right now?"],
    "restaurant": ["Recommend somewhere to eat {cuisine} in {city} tonight."],
    "flights": ["Book-search: flights departing {a} for {b} on {day}, please."],
    "read_file": ["Display the file {path}."], "search": ["Scan {d} for occurrences of {pat}."],
    "run": ["Kick off `{cmd}` and tell me what it prints."],
    "currency": ["If I exchange {amount} {a}, how many {b} do I get?"],
    "translate": ["Render \"{text}\" in {lang}, please."],
    "stock": ["Tell me today's share price of {sym}."], "todo": ["Note down a task: {task}."],
    "wiki": ["Pull up the encyclopedia entry about {topic}."], "timer": ["Count down {mins} minutes for me."],
    "unit": ["Express {v} {a} in {b}."],
}
# Run 7: more phrasings of the same requests: questions, commands, indirect and terse forms, typed
# in a hurry, and more languages. Written apart from HELDOUT_TEMPLATES: none of its sentences, and
# for each tool not the lead words of its held-out phrasings (no "Display" for files, "Scan" for
# searches, "Kick off" for commands, "What hour" for the time, "Report" for the weather...).
MORE_TEMPLATES = {
    "weather": [
        "Weather forecast for {city}?", "What's the sky like over {city}?", "Will it rain in {city} this evening?",
        "Should I take an umbrella in {city}?", "Temperature check for {city}.", "How's it looking outside in {city}?",
        "Is it freezing in {city}?", "What should I wear in {city} today?", "Any snow in {city}?",
        "Is the weather good for a picnic in {city}?", "Conditions in {city}?", "Weather update for {city}, please.",
        "What are temperatures like in {city} this morning?", "Could you pull the weather for {city}?",
        "Find the weather in {city}.", "weather in {city}??", "{city}: weather please", "{city} - how's the weather",
        "Hows the weather in {city}", "Is it hot or cold in {city}?", "Sunny or cloudy in {city} today?",
        "How many degrees is it in {city}?", "I'm about to leave for {city}. Rain or shine?",
        "Can I go cycling in {city} today, or is it pouring?", "What's the outlook for {city} today?",
        "Give me today's weather for {city}.", "Quick weather lookup: {city}.", "Look up how warm it is in {city}.",
        "Is it foggy in {city} this morning?", "What's the temperature outside in {city} at this moment?",
        "My flight lands in {city} soon. How's the weather there?", "Weather for {city} please!",
        "Hoe is het weer in {city}?", "Como está o tempo em {city}?", "Jaka jest pogoda w {city}?",
        "Hur är vädret i {city}?", "¿Cómo está el clima en {city}?", "Il fait quel temps à {city} ?",
        "Wie warm ist es in {city}?", "Какая погода в {city}?",
    ],
    "weather_unit": [
        "What's the temperature in {city}? Use {unit}.", "{city} temperature in {unit}, please.",
        "How hot is it in {city} in {unit}?", "Show the weather for {city} with {unit} degrees.",
        "Current conditions in {city}, temperature in {unit}.", "In {unit}: how warm is {city} now?",
    ],
    "time": [
        "What's the clock say in {city}?", "Local time {city}?", "Tell me the current time in {city}, please.",
        "Is it morning or evening in {city} right now?", "Time check: {city}.", "What time do they have in {city} now?",
        "Show me the time in {city}.", "Look up the local time in {city}.", "Is it already midnight in {city}?",
        "Is it a good moment to ring my colleague in {city}? What time is it there?", "{city} time?",
        "{city}: what time is it", "Could you get the current local time for {city}?", "Find the time in {city}.",
        "How late is it in {city} now?", "Are people in {city} awake yet? Check their time.",
        "Que horas são em {city}?", "Hoe laat is het in {city}?", "¿Qué hora es en {city}?",
        "Sag mir die Uhrzeit in {city}.", "Il est quelle heure à {city} ?", "Который час в {city}?",
    ],
    "restaurant": [
        "Hungry in {city}. Any {cuisine} restaurants?", "{cuisine} food in {city}?", "Best {cuisine} in {city}?",
        "Look for a {cuisine} place to eat in {city}.", "We want {cuisine} tonight in {city}. Where should we go?",
        "Show me {cuisine} restaurants around {city}.", "Where do I get good {cuisine} in {city}?",
    ],
    "flights": [
        "Flights {a} to {b} on {day}?", "Look up flights from {a} to {b} for {day}.",
        "Is there a flight from {a} to {b} on {day}?", "I want to fly {a} -> {b} on {day}. Options?",
        "Check flights leaving {a} for {b} on {day}.", "Get me flight options {a} to {b}, {day}.",
    ],
    "read_file": [
        "Open the file {path}.", "Show {path}", "Let me see {path}.", "Read {path} and show it to me.",
        "What does {path} contain?", "Give me the contents of {path}.", "Load {path}.", "View {path}, please.",
        "I'd like to look at {path}.", "contents of {path}?", "Print {path} for me.",
    ],
    "search": [
        "Search {d} for \"{pat}\".", "Find {pat} in {d}.", "Which files in {d} mention {pat}?", "grep -rn {pat} {d}",
        "Look through {d} for {pat}.", "Does {pat} appear anywhere in {d}?", "Is {pat} used anywhere in {d}?",
        "Hunt for \"{pat}\" inside {d}.",
    ],
    "run": [
        "Run this: {cmd}", "Execute {cmd} please.", "Can you run `{cmd}`?", "Start `{cmd}` for me.",
        "What does `{cmd}` output?", "Try running {cmd}.", "Please execute `{cmd}` and show the output.",
        "$ {cmd}", "Launch `{cmd}`.", "Go ahead and run {cmd}.", "Run `{cmd}` in the terminal.",
    ],
    "currency": [
        "What is {amount} {a} in {b}?", "Convert {amount} {a} into {b}, please.", "{amount} {a} to {b}",
        "How many {b} is {amount} {a}?", "I need {amount} {a} converted to {b}.",
        "What would {amount} {a} be in {b}?", "Turn {amount} {a} into {b}.",
    ],
    "translate": [
        "Translate to {lang}: \"{text}\"", "Say \"{text}\" in {lang}.", "In {lang}, how would I say \"{text}\"?",
        "Give me the {lang} version of \"{text}\".", "\"{text}\" -> {lang}", "Please translate \"{text}\" for me into {lang}.",
    ],
    "stock": [
        "Stock price of {sym}?", "What's {sym} trading at?", "Quote for {sym}, please.", "How's {sym} doing today?",
        "Look up {sym}.", "{sym} price", "Current price of {sym} stock?", "Fetch the latest {sym} quote.",
    ],
    "todo": [
        "Add a todo: {task}.", "Put {task} on my todo list.", "Todo: {task}", "Don't let me forget to {task}.",
        "Create a task to {task}.", "New task: {task}.", "Can you add \"{task}\" to my tasks?",
    ],
    "wiki": [
        "Tell me about {topic} from Wikipedia.", "Wikipedia: {topic}", "Search Wikipedia about {topic}.",
        "Look up {topic} for me.", "What's the Wikipedia summary of {topic}?", "Find {topic} on Wikipedia.",
    ],
    "timer": [
        "{mins} minute timer please.", "Set a {mins} min timer.", "Timer: {mins} minutes.",
        "Start a timer, {mins} minutes.", "Time me for {mins} minutes.", "Please set a timer of {mins} minutes.",
    ],
    "unit": [
        "Convert {v} {a} into {b}.", "{v} {a} to {b}?", "How much is {v} {a} in {b}?",
        "I have {v} {a}. What is that in {b}?", "Change {v} {a} to {b}, please.",
    ],
    "list_dir": ["What's in {d}?", "Show the contents of the {d} folder.", "List {d}.", "Files in {d}?"],
    "write_file": ["Write the text \"{content}\" into {path}.", "Create {path} containing \"{content}\"."],
    "commit": ["Commit with message \"{msg}\".", "Please commit: {msg}"],
    "calc": ["Calculator: {expr}", "Work out {expr} with the calculator.", "Use the calc tool for {expr}."],
}
for _k, _v in MORE_TEMPLATES.items():
    TEMPLATES[_k] = TEMPLATES[_k] + [t for t in _v if t not in TEMPLATES[_k]]

# Context before and after a request.
PREFIXES = ["Quick question: ", "Hi! ", "Hey, ", "Hello. ", "I'm planning my day. ", "Sorry to bother you. ",
            "One more thing: ", "Okay. ", "I have a question. ", "Good morning! ", "Thanks for earlier. ",
            "I'm on my phone, so short: ", "For a trip I'm planning: ", "hi ", "Hello there, "]
SUFFIXES = [" Thanks!", " Thank you.", " please", " Thanks in advance.", " Cheers.", " Thx"]
PREFIXES += ["Good afternoon! ", "Quick one: ", "Can you help? ", "Hi again. ", "Real quick: ", "Question for you: ",
             "So, ", "Alright. ", "Please help: ", "Hmm. ", "Morning. ", "Hey there! ", "I'm at work right now. ",
             "Sorry, another one: ", "Hello again! ", "Next: ", "One thing: ", "OK so ", "Excuse me. "]
SUFFIXES += [" Thanks a lot.", " Appreciate it.", " ty", " if you can", " asap", " Thank you!", " Please.",
             " Thanks so much."]
HELDOUT_PREFIXES = ["Good evening! ", "Before I forget: ", "Need some help. "]
HELDOUT_SUFFIXES = [" Much appreciated.", " Ta."]

def typo(rng, template):
    """One slip of the keyboard in a word of the template (never in a {slot})."""
    spots = [m for m in re.finditer(r"\{[^}]*\}|[A-Za-z]{4,}", template) if not m.group().startswith("{")]
    if not spots:
        return template
    m = rng.choice(spots)
    w, i = m.group(), rng.randrange(1, len(m.group()) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        w = w[:i] + w[i + 1] + w[i] + w[i + 2:]   # swap
    elif kind == 1:
        w = w[:i] + w[i + 1:]                     # drop
    else:
        w = w[:i] + w[i] + w[i:]                  # double
    return template[:m.start()] + w + template[m.end():]


# Run 7: the lead verb of a request is sometimes one the model has not seen with that tool, or a
# made-up word, so that the object words and the values (a path, a currency code, a quoted text
# and a language...) have to carry the choice. None of the held-out phrasings' lead verbs.
_LEAD_VERBS = {"Find", "Search", "Look", "Show", "Get", "Check", "Tell", "Read", "Open", "Print", "Run", "Execute",
               "Convert", "Change", "Translate", "Add", "Put", "Schedule", "Create", "Send", "Email", "Write", "Save",
               "Commit", "Make", "Set", "Start", "Calculate", "Evaluate", "Compute", "Use", "List", "Fetch", "Give",
               "Load", "View", "Launch", "Try", "Turn", "Say", "Quote", "Hunt", "Time"}
_OTHER_LEADS = ["Handle", "Do", "Process", "Take care of", "Manage", "Perform", "Grab", "Trigger", "Deal with", "Produce",
                "Retrieve", "Obtain", "Provide", "Output", "Return", "Bring up", "Sort out", "Figure out", "Dig up",
                "Go and get", "Quickly get", "Try to get", "Can you do", "I want", "Need", "Do me a favour and get"]


def other_lead(rng, t):
    """The template with its first word, if it is an imperative verb, swapped for another lead or a made-up word."""
    first, _, rest = t.partition(" ")
    if first not in _LEAD_VERBS or not rest:
        return t
    if first == "Look" and rest.startswith(("up ", "for ", "through ")):
        rest = rest.split(" ", 1)[1]
    lead = rng.choice(_OTHER_LEADS) if rng.random() < 0.6 else invented_word(rng).capitalize()
    return f"{lead} {rest}"


def phrase(rng, split, key, **slots):
    """A request: a template of `key` from the split, carelessly typed, with its slots filled."""
    t = rng.choice(HELDOUT_TEMPLATES[key] if split == "heldout" and key in HELDOUT_TEMPLATES else TEMPLATES[key])
    if split != "heldout" and rng.random() < 0.15:
        t = other_lead(rng, t)
    return sloppy(rng, t).format(**slots)


def _slot_split(t):
    return re.split(r"(\{[^}]*\})", t)


def with_context(rng, split, q):
    """Sometimes a greeting or context before the request, or thanks after it."""
    pre, suf = (HELDOUT_PREFIXES, HELDOUT_SUFFIXES) if split == "heldout" else (PREFIXES, SUFFIXES)
    if rng.random() < 0.25:
        p = rng.choice(pre)
        q = p + (q[0].lower() + q[1:] if p.endswith(": ") and not q[1:2].isupper() else q)
    if rng.random() < 0.08:
        q = q + rng.choice(suf)
    return q


def req_weather(rng, split="train"):
    c = city(rng, split)
    unit = rng.choice(["celsius", "fahrenheit"])
    temp = rng.randrange(-5, 35) if unit == "celsius" else rng.randrange(25, 95)
    cond = rng.choice(CONDITIONS)
    args = {"city": c}
    if rng.random() < 0.25:
        args["unit"] = unit
        q = phrase(rng, split, "weather_unit", city=c, unit=unit)
    else:
        unit = "celsius"
        q = phrase(rng, split, "weather", city=c)
    result = {"city": c, "temperature": temp, "unit": unit, "condition": cond}
    deg = "°C" if unit == "celsius" else "°F"
    return q, args, result, f"It is {temp}{deg} and {cond} in {c}."


def req_read_file(rng, split="train"):
    path = file_path(rng, split)
    q = phrase(rng, split, "read_file", path=path)
    lines = rng.randrange(3, 400)
    return q, {"path": path}, {"path": path, "lines": lines, "content": "..."}, f"{path} has {lines} lines; its content is above."


def req_search(rng, split="train"):
    pat = pool(rng, split, WORDS, HELDOUT_WORDS, invented_pattern)
    d = rng.choice(["src", ".", "app", "tests", "lib", "docs", "scripts"]) if split == "heldout" or rng.random() < 0.5 \
        else invented_dir(rng)
    q = phrase(rng, split, "search", pat=pat, d=d)
    hits = rng.randrange(0, 9)
    files = rng.sample(FILES, min(hits, 3))
    ans = (f"\"{pat}\" appears {hits} times in {d}" + (", in " + ", ".join(files) + "." if files else ".")) if hits else f"No matches for \"{pat}\" in {d}."
    return q, {"pattern": pat, "path": d}, {"matches": hits, "files": files}, ans


def req_run(rng, split="train"):
    cmd = pool(rng, split, COMMANDS, HELDOUT_COMMANDS, invented_command)
    q = phrase(rng, split, "run", cmd=cmd)
    code = rng.choice([0, 0, 0, 1, 2])
    ans = f"`{cmd}` finished successfully." if code == 0 else f"`{cmd}` failed with exit code {code}."
    return q, {"command": cmd}, {"exit_code": code, "stdout": "...", "stderr": "" if code == 0 else "error"}, ans


def req_currency(rng, split="train"):
    if split == "heldout":
        a, b = rng.choice(HELDOUT_CURRENCIES), rng.choice(CURRENCIES)
    else:
        a, b = rng.sample(CURRENCIES, 2)
        if rng.random() < 0.3:
            a = invented_currency(rng, (a, b))
    if rng.random() < 0.5:
        a, b = b, a
    amount = rng.choice([rng.randrange(1, 1000), rng.randrange(1, 100) * 10])
    rate = round(rng.uniform(0.5, 1.6), 4) if "JPY" not in (a, b) else round(rng.uniform(0.006, 160), 3)
    out = round(amount * rate, 2)
    q = phrase(rng, split, "currency", amount=amount, a=a, b=b)
    return q, {"amount": amount, "from": a, "to": b}, {"amount": amount, "from": a, "to": b, "result": out}, f"{amount} {a} is {out} {b}."


def req_translate(rng, split="train"):
    text = pool(rng, split, PHRASES, HELDOUT_PHRASES, invented_phrase, 0.6)
    lang = pool(rng, split, LANGS, HELDOUT_LANGS, lambda r: r.choice(MORE_LANGS), 0.4)
    q = phrase(rng, split, "translate", text=text, lang=lang)
    return q, {"text": text, "target_language": lang}, {"translation": "<translated text>"}, f"In {lang}: <translated text>."


def req_event(rng, split="train"):
    title = pool(rng, split, EVENTS + ["Lunch with " + rng.choice(NAMES)], HELDOUT_EVENTS, invented_event)
    day, month, hour = rng.randrange(1, 29), rng.randrange(1, 13), rng.randrange(8, 19)
    date = f"2026-{month:02d}-{day:02d}"
    q = phrase(rng, split, "event", title=title, date=date, time=f"{hour}:00")
    args = {"title": title, "date": date, "time": f"{hour:02d}:00"}
    return q, args, {"status": "created", "id": rng.randrange(1000, 9999)}, f"Done: \"{title}\" is on your calendar for {date} at {hour:02d}:00."


def req_email(rng, split="train"):
    to = rng.choice(NAMES).lower() + rng.choice(["@example.com", "@example.org", "@mail.example"])
    if split != "heldout" and rng.random() < 0.5:
        to = invented_email(rng)
    subject = pool(rng, split, SUBJECTS, HELDOUT_SUBJECTS, invented_subject)
    q = phrase(rng, split, "email", to=to, subject=subject)
    args = {"to": to, "subject": subject, "body": "I'll be late."}
    return q, args, {"status": "sent"}, f"Your email \"{subject}\" was sent to {to}."


def req_stock(rng, split="train"):
    sym = pool(rng, split, STOCKS, HELDOUT_STOCKS, invented_ticker)
    price = round(rng.uniform(20, 900), 2)
    q = phrase(rng, split, "stock", sym=sym)
    return q, {"symbol": sym}, {"symbol": sym, "price": price, "currency": "USD"}, f"{sym} is trading at ${price}."


def req_timezone(rng, split="train"):
    c = city(rng, split)
    h, m = rng.randrange(24), rng.randrange(60)
    q = phrase(rng, split, "time", city=c)
    return q, {"city": c}, {"city": c, "time": f"{h:02d}:{m:02d}"}, f"It is {h:02d}:{m:02d} in {c}."


def req_todo(rng, split="train"):
    task = pool(rng, split, TASKS, HELDOUT_TASKS, _task)
    prio = rng.choice(["low", "medium", "high"])
    if rng.random() < 0.4:
        q, args = phrase(rng, split, "todo_prio", task=task, prio=prio), {"task": task, "priority": prio}
    else:
        q, args = phrase(rng, split, "todo", task=task), {"task": task}
    return q, args, {"status": "added", "count": rng.randrange(1, 20)}, f"Added \"{task}\" to your todo list."


def req_calc(rng, split="train"):
    a, b = rng.randrange(100, 10000), rng.randrange(2, 500)
    op = rng.choice(["*", "/", "+", "-"])
    expr = f"{a} {op} {b}"
    val = {"*": a * b, "/": round(a / b, 4), "+": a + b, "-": a - b}[op]
    q = phrase(rng, split, "calc", expr=expr)
    return q, {"expression": expr}, {"result": val}, f"{expr} = {val}."


def req_wiki(rng, split="train"):
    topic = pool(rng, split, TOPICS, HELDOUT_TOPICS, invented_topic)
    q = phrase(rng, split, "wiki", topic=topic)
    return q, {"query": topic}, {"title": topic, "summary": "<summary text>"}, f"Here is what Wikipedia says about {topic}: <summary text>."


def req_list_dir(rng, split="train"):
    d = rng.choice(["src", ".", "tests", "docs", "crates", "app", "scripts", "config", "data", "src/bin"]) \
        if split == "heldout" or rng.random() < 0.5 else invented_dir(rng)
    names = rng.sample(["main.rs", "lib.rs", "mod.rs", "README.md", "utils.py", "index.md", "config.toml", "api.rs"], 3)
    q = phrase(rng, split, "list_dir", d=d)
    return q, {"path": d}, {"entries": names}, f"{d} contains " + ", ".join(names) + "."


def req_write_file(rng, split="train"):
    path = file_path(rng, split)
    content = rng.choice(["hello world", "print('hi')", "- [ ] ship it", "{\"ok\": true}", "pub fn answer() -> u32 { 42 }",
                          "TODO: tests", "version = 2"]) if split == "heldout" or rng.random() < 0.5 else invented_content(rng)
    q = phrase(rng, split, "write_file", content=content, path=path)
    return q, {"path": path, "content": content}, {"status": "written", "bytes": len(content)}, f"Wrote {len(content)} bytes to {path}."


def req_flights(rng, split="train"):
    a, b = cities(rng, split, 2)
    day = f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    q = phrase(rng, split, "flights", a=a, b=b, day=day)
    price = rng.randrange(80, 1200)
    return q, {"origin": a, "destination": b, "date": day}, {"flights": [{"price": price, "currency": "EUR"}]}, f"The cheapest flight from {a} to {b} on {day} costs {price} EUR."


def req_git_commit(rng, split="train"):
    msg = pool(rng, split, COMMITS, HELDOUT_COMMITS, invented_commit)
    q = phrase(rng, split, "commit", msg=msg)
    return q, {"message": msg}, {"commit": "%07x" % rng.randrange(16 ** 7)}, f"Committed: \"{msg}\"."


def req_restaurant(rng, split="train"):
    c, cuisine = city(rng, split), pool(rng, split, CUISINES, HELDOUT_CUISINES, lambda r: r.choice(MORE_CUISINES), 0.3)
    q = phrase(rng, split, "restaurant", cuisine=cuisine, city=c)
    name = rng.choice(["Luna", "Sakura", "El Sol", "Masala House", "Green Leaf", "Bangkok Garden"])
    return q, {"city": c, "cuisine": cuisine}, {"results": [{"name": name, "rating": round(rng.uniform(3.5, 5), 1)}]}, f"Try {name} in {c}."


def req_timer(rng, split="train"):
    mins = rng.randrange(1, 90)
    q = phrase(rng, split, "timer", mins=mins)
    return q, {"minutes": mins}, {"status": "started"}, f"Timer set for {mins} minutes."


def req_unit(rng, split="train"):
    v = rng.randrange(1, 500)
    a, b = rng.choice([("miles", "kilometers"), ("pounds", "kilograms"), ("inches", "centimeters"), ("liters", "gallons")])
    q = phrase(rng, split, "unit", v=v, a=a, b=b)
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
    "city": ["location", "place", "city_name", "town", "where", "locality"],
    "path": ["file_path", "filename", "target", "file", "filepath"],
    "pattern": ["query", "regex", "needle", "search_term", "text"], "command": ["cmd", "script", "cmdline", "shell_command"],
    "text": ["input", "source_text", "sentence", "content"], "query": ["q", "search", "terms", "topic", "title"],
    "task": ["title", "item", "todo", "description"], "expression": ["expr", "formula", "input", "math"],
    "symbol": ["ticker", "stock", "code"], "message": ["msg", "commit_message", "text", "summary"],
    "minutes": ["duration", "mins", "length", "time_minutes"], "to": ["recipient", "address", "email", "to_address"],
    "content": ["text", "data", "body", "contents"], "subject": ["title", "topic", "subject_line", "heading"],
    "body": ["text", "message", "content", "email_body"], "date": ["day", "on_date", "when", "event_date"],
    "time": ["at", "start", "start_time", "hour"], "title": ["name", "summary", "event", "label"],
    "unit": ["units", "scale", "temp_unit"], "amount": ["value", "sum", "quantity"],
    "from": ["source", "from_currency", "base", "src"], "target_language": ["language", "lang", "to_language", "target"],
    "priority": ["prio", "importance", "level"], "origin": ["from_city", "departure", "source", "start"],
    "destination": ["to_city", "arrival", "dest", "end"], "cuisine": ["food", "kind", "style", "category"],
    "value": ["amount", "quantity", "number", "x"], "from_unit": ["source_unit", "unit_from", "src_unit"],
    "to_unit": ["target_unit", "unit_to", "dst_unit"],
}


def styled(rng, name):
    """A name as another API might spell it: prefixed, suffixed, camelCase or kebab-case."""
    name = rng.choice(["", "", "", "my_", "api_", "tool_", "svc_", "do_"]) + name + rng.choice(["", "", "", "_v2", "_tool", "_api"])
    style = rng.randrange(5)
    if style == 0:
        parts = name.split("_")
        name = parts[0] + "".join(w[:1].upper() + w[1:] for w in parts[1:])
    elif style == 1:
        name = name.replace("_", "-")
    return name


# Other descriptions of the same tools (the first of TOOLS' is one more); the SDK tests' own
# schemas are among the variants ("Weather forecast", "Read a file", get_time without one).
ALT_DESCRIPTIONS = {
    "get_weather": ["Weather forecast", "Current weather conditions.", "Returns temperature and conditions for a place.",
                    "Look up the weather.", "Weather lookup by city"],
    "read_file": ["Read a file", "Returns the contents of a file.", "Open a file and return its text."],
    "search_files": ["Grep the project.", "Find text in files", "Search files for a pattern."],
    "run_command": ["Execute a shell command.", "Run a command", "Runs a command line and returns stdout and stderr."],
    "convert_currency": ["Currency conversion", "Convert money from one currency to another.", "Exchange rates."],
    "translate": ["Translate text", "Machine translation into a target language.", "Translates a sentence."],
    "create_event": ["Add an event to the calendar.", "Calendar: new event", "Schedule something."],
    "send_email": ["Send an email.", "Send a message by e-mail.", "Email someone", "Compose and send an email."],
    "get_stock_price": ["Stock quote", "Current share price for a ticker.", "Returns the last trade price."],
    "get_time": ["Current time in a place.", "World clock", "Returns the local time."],
    "add_todo": ["Add a todo item.", "Todo list: add", "Create a task."],
    "calculator": ["Calculator", "Exact arithmetic.", "Evaluates math expressions."],
    "search_wikipedia": ["Wikipedia search", "Look something up in the encyclopedia.", "Returns a Wikipedia summary."],
    "list_directory": ["List files", "Directory listing.", "Shows what a folder contains."],
    "write_file": ["Write a file", "Save text to a file.", "Overwrite a file with new content."],
    "search_flights": ["Flight search", "Find flights for a date.", "Search for flights."],
    "git_commit": ["Create a git commit.", "Commit changes", "git commit -a"],
    "find_restaurant": ["Restaurant search", "Search places to eat.", "Find somewhere to eat."],
    "set_timer": ["Timer", "Set a countdown.", "Starts a timer."],
    "convert_units": ["Unit conversion", "Convert between units.", "Converts a quantity to another unit."],
}
ALT_PARAM_DESCRIPTIONS = {
    "city": ["City name", "The city", "Name of the city or town", "Where", "City, e.g. Berlin", "Location"],
    "unit": ["celsius or fahrenheit", "Unit", "Units for the temperature"],
    "path": ["File path", "Path", "Relative path of the file", "Where"], "pattern": ["Search text", "What to find"],
    "command": ["Command to run", "Shell command"], "amount": ["How much", "Amount"],
    "from": ["Source currency", "Currency code to convert from"], "convert_currency.to": ["Target currency", "Currency code"],
    "send_email.to": ["Recipient", "Email address of the recipient", "Who gets it"],
    "text": ["The text", "What to translate"], "target_language": ["Target language", "Language"],
    "title": ["Title", "Name of the event"], "date": ["Date", "The day (YYYY-MM-DD)"], "time": ["Time", "Start time"],
    "subject": ["Subject", "Email subject"], "body": ["Body text", "Content of the email"],
    "symbol": ["Ticker", "Stock symbol"], "task": ["Task", "The todo item"], "priority": ["Priority level"],
    "expression": ["Math expression", "Expression"], "query": ["Query", "What to look up"],
    "content": ["Content", "New text of the file"], "origin": ["From", "Departure"], "destination": ["To", "Arrival"],
    "message": ["Message", "The commit message"], "cuisine": ["Cuisine", "Food type"],
    "minutes": ["Minutes", "How long"], "value": ["Number", "Quantity"], "from_unit": ["From unit", "Source unit"],
    "to_unit": ["To unit", "Target unit"],
}
# Optional parameters a variant may add (never filled by the request).
EXTRA_PARAMS = {
    "get_weather": [("days", {"type": "integer", "description": "Number of days", "minimum": 1, "maximum": 7}),
                    ("days", {"type": "integer"}), ("lang", {"type": "string", "description": "Language of the report"})],
    "get_time": [("zone", {"type": "string", "description": "Time zone"}), ("format", {"type": "string", "enum": ["12h", "24h"]})],
    "send_email": [("cc", {"type": "string", "description": "Copy to"}), ("html", {"type": "boolean"})],
    "read_file": [("encoding", {"type": "string"}), ("max_lines", {"type": "integer", "description": "Lines to read at most"})],
}
_GENERIC_EXTRAS = [("language", {"type": "string", "description": "Answer language"}),
                   ("limit", {"type": "integer", "description": "Maximum number of results"}),
                   ("verbose", {"type": "boolean", "description": "More detail"}),
                   ("format", {"type": "string", "enum": ["text", "json"]}), ("timeout", {"type": "integer"})]


def _rename(rng, p, taken):
    """A parameter name for the canonical one: itself, an alias, or a spelling no table holds."""
    r = rng.random()
    alias = p if r < 0.3 else rng.choice(PARAM_ALIASES.get(p, []) + [p])
    if rng.random() < 0.3:
        r2 = rng.random()
        if r2 < 0.35:
            parts = alias.split("_")
            alias = parts[0] + "".join(w[:1].upper() + w[1:] for w in parts[1:])
        elif r2 < 0.7:
            alias = rng.choice(["in_", "arg_", "the_", "p_", "x_"]) + alias
        elif r2 < 0.9:
            alias = alias + rng.choice(["_name", "_value", "_str", "Value", "_in"])
        else:
            alias = rng.choice(["value", "input", "arg0", "param", invented_word(rng)])
    return alias if alias not in taken else p if p not in taken else p + str(len(taken) + 1)


def variant(rng, schema, args_list):
    """The schema as another API might write it, and the arguments renamed to match: another
    tool name two times in three; the description kept, replaced or left out; each parameter
    under its name, an alias or another spelling, its description kept, replaced or left out;
    optional parameters the request does not fill present or not, others added; the properties
    in any order. Nothing can be keyed on one schema text: names and values have to be copied
    from the offered schema and the request."""
    f = schema["function"]
    if rng.random() < 0.35:
        name = f["name"]
    else:
        base = rng.choice(NAME_ALIASES.get(f["name"], []) + [f["name"]])
        r = rng.random()
        name = base if r < 0.4 else styled(rng, base) if r < 0.9 else f"{rng.choice(['tool', 'fn', 'action', 'op'])}_{rng.randrange(1, 100)}"
        if name in _HELDOUT_NAMES:
            name = f["name"]
    r = rng.random()
    desc = f["description"] if r < 0.3 else rng.choice(ALT_DESCRIPTIONS.get(f["name"], [f["description"]])) if r < 0.8 else None
    props, required = f["parameters"]["properties"], f["parameters"]["required"]
    used = {k for a in args_list for k in a}
    rename, new_props = {}, {}
    keep_optional = rng.random() < 0.5
    for p, spec in props.items():
        if p not in required and p not in used and not keep_optional:
            continue
        alias = _rename(rng, p, set(rename.values()) | set(props) - {p})
        rename[p] = alias
        spec = dict(spec)
        r = rng.random()
        if r < 0.35:
            pass
        elif r < 0.7:
            alts = ALT_PARAM_DESCRIPTIONS.get(f"{f['name']}.{p}") or ALT_PARAM_DESCRIPTIONS.get(p) \
                or [spec[k] for k in ("description",) if k in spec]
            if alts:
                spec["description"] = rng.choice(alts)
        else:
            spec.pop("description", None)
        if spec["type"] == "string" and "enum" not in spec and rng.random() < 0.08:
            longest = max((len(str(a[p])) for a in args_list if p in a), default=0)
            spec["maxLength"] = max(longest, rng.choice([12, 20, 32, 64]))
        new_props[alias] = {k: spec[k] for k in ("type", "description", "enum", "maxLength", "minimum", "maximum")
                            if k in spec}
    new_required = [rename[p] for p in required]
    if rng.random() < 0.25:
        extra, spec = rng.choice(EXTRA_PARAMS.get(f["name"], []) + _GENERIC_EXTRAS)
        if extra not in new_props:
            new_props[extra] = dict(spec)
            if rng.random() < 0.1 and not args_list:
                new_required.append(extra)
    items = list(new_props.items())
    if rng.random() < 0.5:
        rng.shuffle(items)
    params = {"type": "object", "properties": dict(items), "required": new_required}
    if rng.random() < 0.15:
        params["additionalProperties"] = False
    fn = {"name": name}
    if desc is not None:
        fn["description"] = desc
    if rng.random() < 0.05:
        fn["strict"] = True
    fn["parameters"] = params
    return {"type": "function", "function": fn}, [{rename[k]: v for k, v in a.items()} for a in args_list]


_HELDOUT_NAMES = {"get_air_quality", "track_package", "get_sunrise", "play_music", "train_times"}


def noisy(rng, text):
    """Users type carelessly: sometimes lower-case, sometimes without the final punctuation."""
    if rng.random() < 0.15:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.15 and text[-1] in ".?!":
        text = text[:-1]
    return text


# Whole tools that training never offers (name and schema): the held-out set asks for them.
def req_air_quality(rng, split="heldout"):
    c = city(rng, split)
    aqi = rng.randrange(5, 180)
    q = rng.choice([f"How clean is the air in {c} today?", f"What's the air quality in {c} right now?",
                    f"Is the air polluted in {c} at the moment?", f"Check the AQI for {c}."])
    return q, {"city": c}, {"city": c, "aqi": aqi}, f"The air quality index in {c} is {aqi}."


def req_package(rng, split="heldout"):
    number = "1Z" + "".join(rng.choice("0123456789ABCDEF") for _ in range(10))
    q = rng.choice([f"Where is my package {number}?", f"Track parcel {number}.",
                    f"Has shipment {number} been delivered yet?"])
    return q, {"tracking_number": number}, {"status": "in transit"}, f"Package {number} is in transit."


def req_sunrise(rng, split="heldout"):
    c = city(rng, split)
    q = rng.choice([f"When does the sun rise in {c} tomorrow?", f"What time is sunrise in {c}?",
                    f"Sunrise in {c}?"])
    return q, {"city": c}, {"city": c, "sunrise": "06:12"}, f"The sun rises at 06:12 in {c}."


def req_song(rng, split="heldout"):
    title, artist = rng.choice([("Yesterday", "The Beatles"), ("Clair de Lune", "Debussy"), ("Hallelujah", "Leonard Cohen"),
                                ("Dancing Queen", "ABBA")])
    q = rng.choice([f"Play {title} by {artist}.", f"Put on \"{title}\" from {artist}, please.",
                    f"I want to hear {title} by {artist}."])
    return q, {"title": title, "artist": artist}, {"status": "playing"}, f"Now playing {title} by {artist}."


def req_train(rng, split="heldout"):
    a, b = cities(rng, split, 2)
    q = rng.choice([f"When is the next train from {a} to {b}?", f"Train times {a} to {b}?",
                    f"I need a train from {a} to {b} this evening. What's available?"])
    return q, {"origin": a, "destination": b}, {"departures": ["18:05", "18:40"]}, f"The next trains from {a} to {b} leave at 18:05 and 18:40."


HELDOUT_TOOLS = [
    (tool("get_air_quality", "Get the current air quality index (AQI) for a city.", {"city": s("City name")}, ["city"]),
     req_air_quality),
    (tool("track_package", "Track a parcel by its tracking number.", {"tracking_number": s("Carrier tracking number")},
          ["tracking_number"]), req_package),
    (tool("get_sunrise", "Get the time of sunrise in a city.", {"city": s("City name")}, ["city"]), req_sunrise),
    (tool("play_music", "Play a song on the user's speakers.", {"title": s("Song title"), "artist": s("Artist")},
          ["title"]), req_song),
    (tool("train_times", "Find the next train departures between two stations.",
          {"origin": s("Departure station or city"), "destination": s("Arrival station or city")},
          ["origin", "destination"]), req_train),
]


def _check_split():
    """Training never sees a held-out city, phrasing or tool (the held-out rate depends on it)."""
    assert not set(TRAIN_CITIES) & set(HELDOUT_CITIES)
    assert not [c for c in TRAIN_CITIES + CITIES + list(CAPITALS.values()) + list(CAPITALS) if leaks_heldout(c)]
    for key, held in HELDOUT_TEMPLATES.items():
        assert not set(held) & set(TEMPLATES[key]), key
    for train, held in ((FILES, HELDOUT_FILES), (WORDS, HELDOUT_WORDS), (COMMANDS, HELDOUT_COMMANDS),
                        (CURRENCIES, HELDOUT_CURRENCIES), (LANGS, HELDOUT_LANGS), (PHRASES, HELDOUT_PHRASES),
                        (STOCKS, HELDOUT_STOCKS), (TASKS, HELDOUT_TASKS), (TOPICS, HELDOUT_TOPICS),
                        (EVENTS, HELDOUT_EVENTS), (SUBJECTS, HELDOUT_SUBJECTS), (COMMITS, HELDOUT_COMMITS),
                        (CUISINES, HELDOUT_CUISINES), (PREFIXES, HELDOUT_PREFIXES), (SUFFIXES, HELDOUT_SUFFIXES),
                        (LANGS + MORE_LANGS, HELDOUT_LANGS), (CUISINES + MORE_CUISINES, HELDOUT_CUISINES)):
        assert not set(train) & set(held), set(train) & set(held)
    names = {t["function"]["name"] for t, _ in TOOLS} | {a for v in NAME_ALIASES.values() for a in v}
    assert _HELDOUT_NAMES == {t["function"]["name"] for t, _ in HELDOUT_TOOLS}
    assert not names & _HELDOUT_NAMES



def heldout_leak(text):
    """The first held-out city or held-out tool name in a training text, or None (train.py
    refuses data where this is not None)."""
    global _HELDOUT_RE
    if _HELDOUT_RE is None:
        names = HELDOUT_CITIES + [t["function"]["name"] for t, _ in HELDOUT_TOOLS]
        _HELDOUT_RE = re.compile("|".join(re.escape(x) for x in sorted(names, key=len, reverse=True)))
    m = _HELDOUT_RE.search(text)
    return m.group() if m else None


_HELDOUT_RE = None


def offered_tools(rng, k, schema, split="train"):
    """The right tool among 0..5 others (each possibly renamed in training), shuffled. Held out:
    the others come from training's tools and the held-out ones, under their own names."""
    if split == "heldout":
        everything = [t for t, _ in TOOLS + HELDOUT_TOOLS if t["function"]["name"] != schema["function"]["name"]]
        tools = rng.sample(everything, rng.randrange(0, 5)) + [schema]
    else:
        others = rng.sample([i for i in range(len(TOOLS)) if i != k], rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5]))
        tools = [variant(rng, TOOLS[i][0], [])[0] for i in others] + [schema]
    rng.shuffle(tools)
    return tools


# Held-out requests for training's tools: only the kinds with held-out phrasings.
_HELDOUT_KINDS = {"get_weather": 4, "get_time": 2, "find_restaurant": 1, "search_flights": 1, "read_file": 1,
                  "search_files": 1, "run_command": 1, "convert_currency": 1, "translate": 1, "get_stock_price": 1,
                  "add_todo": 1, "search_wikipedia": 1, "set_timer": 1, "convert_units": 1}


def heldout_tool_request(rng):
    """One held-out request: (user text, offered tools, expected (name, arguments)). Training's
    tools asked in held-out phrasings with held-out values (weather most often), or a tool of
    HELDOUT_TOOLS; the right tool alone or among up to 4 others."""
    if rng.random() < 0.35:
        schema, req = rng.choice(HELDOUT_TOOLS)
        q, args, _, _ = req(rng, "heldout")
    else:
        by_name = {t["function"]["name"]: (t, r) for t, r in TOOLS}
        name = rng.choices(list(_HELDOUT_KINDS), list(_HELDOUT_KINDS.values()))[0]
        schema, req = by_name[name]
        while True:
            q, args, _, _ = req(rng, "heldout")
            if name != "add_todo" or "priority" not in args:
                break
    q = with_context(rng, "heldout", q)
    tools = [schema] if rng.random() < 0.5 else offered_tools(rng, -1, schema, "heldout")
    return q, tools, (schema["function"]["name"], args)


# Invented tools, made here per conversation. Copying from the prompt is the skill these teach:
# the tool's name, its parameter names and the argument values exist only in this one
# conversation (names styled in many ways, places in several scripts, codes, titles, people,
# e-mail addresses...), so nothing can be recalled; the right tool is often offered beside
# invented distractors that share words with it or with the request, so the name and the
# description have to be read. None of them is a held-out tool's kind (no air quality,
# sunrise, parcels, music or trains).
_BANNED_WORDS = ("air", "sun", "parcel", "package", "music", "song", "train", "track", "deliver", "shipment",
                 "artist", "album", "playlist", "rail", "station")
_RUDE = ("rape", "nazi", "anus", "cunt", "fuck", "sex", "kill", "slut", "porn", "dick", "shit", "piss")
_ACCENTS = {"a": "áäåâ", "e": "éèë", "i": "íî", "o": "óöøô", "u": "úüů", "c": "čç", "s": "šş", "z": "žż",
            "n": "ñň", "l": "ł", "r": "ř", "g": "ğ"}
_CJK = "山川田中島松本新東西南北原野村井石林森木水海浜崎橋岡宮沢平長高小谷口竹花月星風雪湖泉港"
_HANGUL = "가나다라마바사아자차카타파하강남동서산천성주수원진해광포"
_SCRIPTS = [dict(zip("abvgdezijklmnoprstufhc", "абвгдезийклмнопрстуфхц")),
            dict(zip("abgdezhiklmnxoprstufy", "αβγδεζηικλμνξοπρστυφυ"))]
_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
_ALNUM = "0123456789" + _LETTERS


def _clean(value):
    return not leaks_heldout(value) and heldout_leak(value) is None


def invented_word(rng, k=None):
    """A made-up lower-case word of 2-3 syllables."""
    while True:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(k or rng.randrange(2, 4)))
        if _clean(w) and not any(b in w for b in _BANNED_WORDS + _RUDE):
            return w


def invented_place(rng):
    """A made-up place: Latin letters (some accented), or Chinese/Japanese, Korean, Cyrillic, Greek."""
    while True:
        r = rng.random()
        if r < 0.08:
            name = "".join(rng.choice(_CJK) for _ in range(rng.randrange(2, 4)))
        elif r < 0.13:
            name = "".join(rng.choice(_HANGUL) for _ in range(rng.randrange(2, 4)))
        elif r < 0.4:
            name = letters_name(rng)
        else:
            name = invented_city(rng)
            if r < 0.2:
                m = rng.choice(_SCRIPTS)
                name = "".join(m.get(ch, "") for ch in name.lower())
                name = name[:1].upper() + name[1:]
            elif r < 0.45:
                chars = list(name)
                spots = [i for i, ch in enumerate(chars) if ch in _ACCENTS]
                for i in rng.sample(spots, min(len(spots), rng.randrange(1, 3))):
                    chars[i] = rng.choice(_ACCENTS[chars[i]])
                name = "".join(chars)
        if len(name) >= 2 and name not in TRAIN_CITIES and _clean(name) and not any(b in _key(name) for b in _RUDE):
            return name


_CONS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "ch", "sh", "th",
         "br", "tr", "kr", "st", "gl", "pl", "x", "q", "y"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "o", "ai", "ou", "ea", "y", "ø", "ü", "é"]


def letters_name(rng):
    """A made-up name from letters rather than syllables (Osaka-like, Brevnø-like, Tlaquemba-like),
    sometimes two words or hyphenated."""
    def word():
        w = "" if rng.random() < 0.4 else rng.choice(_CONS)
        for _ in range(rng.randrange(2, 5)):
            w += rng.choice(_VOWELS) + rng.choice(_CONS + ["", "n", "r", "l"])
        return w[:1].upper() + w[1:]
    r = rng.random()
    if r < 0.12:
        return word() + " " + word()
    if r < 0.18:
        return word() + "-" + rng.choice(["sur-", "on-", "am-", "de-", "la-"]) + word()
    return word()


def train_place(rng):
    return rng.choice(TRAIN_CITIES) if rng.random() < 0.3 else invented_place(rng)


def invented_person(rng):
    first = invented_word(rng, 2).capitalize() if rng.random() < 0.6 else rng.choice(NAMES)
    last = invented_word(rng).capitalize() + rng.choice(["", "", "", "son", "ova", "ez", "i", "en", "ski"])
    return f"{first} {last}"


def invented_username(rng):
    return rng.choice([invented_word(rng), rng.choice(NAMES).lower()]) + rng.choice(["", "_", "."]) + \
        rng.choice([str(rng.randrange(1, 999)), invented_word(rng, 1), ""])


def invented_email(rng):
    local = rng.choice([invented_word(rng, 2), rng.choice(NAMES).lower() + "." + invented_word(rng, 2)])
    return f"{local}@{invented_word(rng, 2)}.{rng.choice(['com', 'org', 'io', 'net', 'dev', 'example'])}"


def invented_code(rng):
    """An identifier in one of many formats: order numbers, tickets, serials, hashes..."""
    digits = lambda k: "".join(rng.choice("0123456789") for _ in range(k))  # noqa: E731
    alnum = lambda k: "".join(rng.choice(_ALNUM) for _ in range(k))  # noqa: E731
    pre = "".join(rng.choice(_LETTERS) for _ in range(rng.randrange(1, 4)))
    f = rng.randrange(7)
    if f == 0:
        return f"{pre}-{digits(rng.randrange(3, 7))}"
    if f == 1:
        return pre + alnum(rng.randrange(6, 12))
    if f == 2:
        return f"#{digits(rng.randrange(3, 6))}"
    if f == 3:
        return f"{pre}-{rng.randrange(2019, 2027)}-{digits(4)}"
    if f == 4:
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.randrange(6, 13)))
    if f == 5:
        return f"{alnum(3)}-{alnum(3)}-{alnum(3)}"
    return digits(rng.randrange(5, 11))


_TITLE_ADJ = ["Silent", "Golden", "Hidden", "Last", "Broken", "Quiet", "Red", "Distant", "Little", "Endless", "Paper",
              "Glass", "Winter", "Velvet", "Hollow", "Crooked", "Bright", "Lost", "Northern", "Salt", "Seventh", "Iron"]
_TITLE_NOUN = ["River", "Garden", "Lantern", "Harbor", "Orchard", "Machine", "Letters", "Compass", "Island", "Mirror",
               "Tower", "Ladder", "Door", "Forest", "Engine", "Map", "Bridge", "Kingdom", "Clock", "Feather", "Orbit"]


def invented_title(rng):
    f = rng.randrange(5)
    a, n = rng.choice(_TITLE_ADJ), rng.choice(_TITLE_NOUN)
    if f == 0:
        t = f"The {a} {n}"
    elif f == 1:
        t = f"{n} of {invented_place(rng)}"
    elif f == 2:
        t = f"{invented_word(rng).capitalize()} {n}"
    elif f == 3:
        t = f"A {n} for {invented_word(rng, 2).capitalize()}"
    else:
        t = f"{a} {invented_word(rng).capitalize()}"
    return t if _clean(t) else invented_title(rng)


_MORE_EXTS = [".tsx", ".jsx", ".html", ".css", ".scss", ".sql", ".rb", ".java", ".kt", ".swift", ".php", ".ini",
              ".cfg", ".xml", ".proto", ".vue", ".h", ".cpp", ".ipynb", ".lock", ".log", ".pdf", ".png", ".svg"]


def invented_path(rng):
    stem = rng.choice([invented_word(rng), rng.choice(_STEMS), invented_word(rng, 1) + "_" + rng.choice(_STEMS),
                       invented_word(rng).capitalize() + rng.choice(_STEMS).capitalize(),
                       invented_word(rng, 1) + "-" + rng.choice(_STEMS)])
    p = stem + rng.choice(_EXTS + _MORE_EXTS)
    if rng.random() < 0.7:
        p = rng.choice(_DIRS + [invented_word(rng, 2)]) + "/" + p
        if rng.random() < 0.3:
            p = rng.choice(_DIRS + [invented_word(rng), "backend", "frontend", "infra", "public", "internal"]) + "/" + p
    return p if p not in HELDOUT_FILES and _clean(p) else invented_path(rng)


def _date(rng):
    return f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def _task(rng):
    return rng.choice([f"call {invented_person(rng)}", f"pick up the {invented_word(rng)}",
                       f"check the {invented_word(rng)} report", f"email {invented_username(rng)}",
                       f"renew the {invented_word(rng)} licence", f"water the {invented_word(rng)}"])


def _ticket_title(rng):
    return invented_word(rng).capitalize() + " " + rng.choice(
        ["crashes on start", "shows the wrong date", "is slow", "fails to sync", "loses settings", "returns 500",
         "needs a new logo", "times out", "ignores the config"])


VALUES = {  # value kind -> maker
    "place": train_place, "person": invented_person, "user": invented_username, "email": invented_email,
    "code": invented_code, "title": invented_title, "path": invented_path, "date": _date,
    "time": lambda r: f"{r.randrange(6, 23):02d}:{r.choice(['00', '15', '30', '45'])}",
    "word": invented_word, "task": _task, "ticket": _ticket_title,
    "venue": lambda r: r.choice(["Trattoria", "Café", "Bistro", "Casa", "The", "Chez", "Taverna", "Kitchen"]) + " "
    + invented_word(r).capitalize(),
    "item": lambda r: rng_item(r),
    "listname": lambda r: r.choice(["groceries", "packing", "reading", "gift ideas", "hardware store", "party",
                                    invented_word(r)]),
    "iban": lambda r: "".join(r.choice(_LETTERS) for _ in range(2)) + f"{r.randrange(10, 99)}"
    + "".join(r.choice("0123456789") for _ in range(r.randrange(12, 19))),
    "project": lambda r: r.choice([invented_word(r).capitalize(), "project-" + invented_word(r), invented_word(r, 2)]),
    "room": lambda r: r.choice(["living room", "kitchen", "bedroom", "office", "bathroom", "hallway", "nursery",
                                "attic", "garage", "study", invented_word(r) + " room"]),
    "product": lambda r: invented_word(r).capitalize() + " " + r.choice(
        ["kettle", "blender", "lamp", "backpack", "drill", "router", "chair", "toaster", "tent", "desk"]),
    "role": lambda r: r.choice(["data analyst", "nurse", "welder", "barista", "backend developer", "electrician",
                                "teacher", "accountant", "graphic designer", "pilot", "chef", "lab technician",
                                invented_word(r) + " specialist"]),
    "activity": lambda r: r.choice(["running", "swimming", "cycling", "yoga", "rowing", "climbing", "boxing",
                                    "pilates", "hiking", "skating", invented_word(r)]),
    "lang": lambda r: r.choice(LANGS),
    "msg": lambda r: r.choice(["I'm running late", f"see you at {invented_place(r)}", f"the {invented_word(r)} is ready",
                               "call me back", f"meeting moved to {r.randrange(8, 19)}:30",
                               f"bring the {invented_word(r)}", f"ask {invented_person(r)} about it"]),
    "address": lambda r: f"{r.randrange(1, 240)} {invented_word(r).capitalize()} "
    + r.choice(["Street", "Road", "Lane", "Avenue", "Way", "Straße", "Gasse"]),
}


MORE_LANGS = ["Hindi", "Arabic", "Czech", "Hungarian", "Norwegian", "Danish", "Indonesian", "Hebrew", "Ukrainian",
              "Romanian", "Catalan", "Welsh", "Irish", "Icelandic", "Estonian", "Latvian", "Tagalog", "Bengali",
              "Urdu", "Persian", "Malay", "Serbian", "Croatian", "Bulgarian", "Slovak", "Basque", "Galician", "Zulu",
              "Yoruba", "Amharic", "Latin", "Esperanto", "Mongolian", "Nepali", "Tamil", "Thai"]
MORE_CUISINES = ["turkish", "vietnamese", "spanish", "moroccan", "brazilian", "nepalese", "polish", "persian",
                 "ramen", "burger", "seafood", "tapas", "dumplings", "bbq", "falafel", "german", "filipino"]
_COMMON = ["coffee", "train", "window", "garden", "ticket", "letter", "kitchen", "bridge", "river", "market", "doctor",
           "meeting", "bicycle", "blanket", "museum", "shop", "key", "bag", "umbrella", "dinner", "map", "phone",
           "bus", "hotel", "room", "friend", "sister", "car", "dog", "book", "song", "door", "street", "weekend"]
_ADJ = ["closed", "late", "broken", "cold", "expensive", "ready", "far away", "too small", "delicious", "empty",
        "very old", "new", "lost", "free", "full", "beautiful", "open", "cheap", "quiet"]


def invented_phrase(rng):
    """A short everyday sentence made here: what a translate request carries."""
    a, b = rng.choice(_COMMON), rng.choice(_COMMON)
    return rng.choice([f"The {a} is {rng.choice(_ADJ)}", f"Where is the {a}?", f"I need a {a} and a {b}",
                       f"My {a} is {rng.choice(_ADJ)}", f"Can I have the {a}, please?", f"We meet at the {a} at {rng.randrange(1, 12)}",
                       f"How far is the {a}?", f"I left my {a} in the {b}", f"Is the {a} {rng.choice(_ADJ)}?",
                       f"{invented_person(rng)} is my {rng.choice(['friend', 'sister', 'doctor', 'neighbour', 'boss'])}",
                       f"Please call {invented_person(rng).split()[0]} tomorrow"])


def invented_pattern(rng):
    w = invented_word(rng)
    return rng.choice([w, f"{w}()", f"{w}_{invented_word(rng, 1)}", w.upper(), f"{w}:{rng.randrange(1000, 9999)}",
                       f"{w}.{invented_word(rng, 1)}", "TODO(" + w + ")", f"@{w}", w.capitalize() + "Error",
                       f"fn {w}", f"import {w}"])


def invented_dir(rng):
    return rng.choice([invented_word(rng), rng.choice(_DIRS) + "/" + invented_word(rng), invented_word(rng, 2) + "s"])


def invented_command(rng):
    w = invented_word(rng)
    return rng.choice([f"python3 {w}.py", f"./{w}.sh", f"make {w}", f"npm run {w}", f"cargo run --bin {w}",
                       f"go run ./cmd/{w}", f"cat {invented_path(rng)}", f"git checkout {w}", f"ls {invented_dir(rng)}",
                       f"docker logs {w}", f"{w} --version", f"grep -rn {w} ."])


def invented_currency(rng, avoid):
    while True:
        c = "".join(rng.choice(_LETTERS) for _ in range(3))
        if c not in avoid and c not in HELDOUT_CURRENCIES and c not in CURRENCIES:
            return c


def invented_ticker(rng):
    while True:
        t = "".join(rng.choice(_LETTERS) for _ in range(rng.randrange(2, 6)))
        if t not in HELDOUT_STOCKS and _clean(t):
            return t


def invented_event(rng):
    return rng.choice([f"Lunch with {invented_person(rng)}", f"{invented_word(rng).capitalize()} review",
                       f"Call {invented_person(rng).split()[0]}", f"{rng.choice(_TITLE_ADJ)} {rng.choice(_COMMON)} meetup",
                       f"{invented_word(rng).capitalize()} workshop", f"Dinner at {invented_place(rng)}",
                       f"{rng.choice(['Tennis', 'Swimming', 'Chess', 'Guitar', 'French'])} with {invented_person(rng).split()[0]}"])


def invented_subject(rng):
    return rng.choice([f"{invented_word(rng).capitalize()} update", f"Re: {invented_title(rng)}",
                       f"Question about {invented_word(rng)}", f"{rng.choice(_TITLE_ADJ)} {rng.choice(_COMMON)}",
                       f"Trip to {invented_place(rng)}", f"Invoice {invented_code(rng)}", f"Draft v{rng.randrange(2, 9)}"])


def invented_topic(rng):
    return rng.choice([invented_person(rng), invented_title(rng), invented_place(rng), invented_word(rng).capitalize()
                       + rng.choice([" (band)", " (river)", " theorem", " effect", " dynasty", ""])])


def invented_commit(rng):
    w = invented_word(rng)
    return rng.choice([f"Fix {w} parsing", f"Add {w} support", f"Remove unused {w}", f"Rename {w} to {invented_word(rng)}",
                       f"Update {invented_path(rng)}", f"Handle empty {w}", f"Speed up {w} lookup"])


def invented_content(rng):
    w = invented_word(rng)
    return rng.choice([f"{w} = {rng.randrange(0, 100)}", f"# {invented_title(rng)}", f"TODO: {w}",
                       f"print('{w}')", f"{{\"{w}\": {rng.randrange(0, 9)}}}", invented_phrase(rng), f"name: {w}"])


def rng_item(r):
    return r.choice(["oat milk", "batteries", "tape", "rice", "a phone charger", "socks", "coffee beans",
                     f"{invented_word(r)} sauce", f"a {invented_word(r)}", f"{invented_word(r)} tea"])


# Lookups: (noun, value kind, parameter names, parameter descriptions, what the value is).
_PLACE = (["city", "city", "location", "place", "town", "city_name", "where", "locality"],
          ["City name", "Name of the city or town", "Place", "Town or city"], "a city")
LOOKUPS = [(noun, "place") + _PLACE for noun in [
    "humidity", "pollen count", "UV index", "traffic", "tide times", "population", "ski conditions", "wind speed",
    "parking availability", "fuel prices", "hotel prices", "public holidays", "water temperature", "snow depth",
    "noise level", "rent prices", "cinema listings", "museum opening hours", "ferry schedule", "bike rentals",
    "local news", "weekend events", "hospital wait times", "power outages", "earthquake reports", "visa rules",
    "sales tax", "plug type", "tipping customs", "emergency numbers", "road closures", "metro status",
    "pharmacy hours", "library hours", "bus schedule", "beach conditions", "crime rate", "median salary",
    "coffee prices", "dialling code", "average rent", "recycling days", "farmers markets", "school holidays",
    "cycling lanes", "elevation", "area code", "postal codes", "mayor", "founding year", "taxi fares", "parking fees",
    "zoo opening hours", "tram status", "flood warnings", "water quality", "ice rink hours", "theatre shows"]] + [
    ("order status", "code", ["order_id", "order", "order_number"], ["Order number"], "an order number"),
    ("invoice", "code", ["invoice_id", "invoice", "invoice_no"], ["Invoice identifier"], "an invoice id"),
    ("support ticket", "code", ["ticket_id", "ticket", "case_id"], ["Ticket number"], "a ticket number"),
    ("booking", "code", ["booking_ref", "reference", "booking_id"], ["Booking reference"], "a booking reference"),
    ("refund status", "code", ["refund_id", "claim", "request_id"], ["Refund request id"], "a refund id"),
    ("warranty status", "code", ["serial_number", "serial", "sn"], ["Serial number"], "a serial number"),
    ("build status", "code", ["build_id", "build", "run_id"], ["CI build id"], "a build id"),
    ("incident report", "code", ["incident_id", "incident", "ref"], ["Incident identifier"], "an incident id"),
    ("insurance claim", "code", ["claim_number", "claim_id"], ["Claim number"], "a claim number"),
    ("licence status", "code", ["license_key", "key", "licence"], ["Licence key"], "a licence key"),
    ("device status", "code", ["device_id", "device", "mac"], ["Device identifier"], "a device id"),
    ("product details", "code", ["sku", "product_id", "item_code"], ["Product code"], "a product code"),
    ("lab result", "code", ["sample_id", "sample", "specimen"], ["Sample id"], "a sample id"),
    ("container logs", "code", ["container_id", "container"], ["Container id"], "a container id"),
    ("vehicle record", "code", ["plate", "registration", "vin"], ["Registration"], "a registration"),
    ("flight status", "code", ["flight_number", "flight", "flight_no"], ["Flight number"], "a flight number"),
    ("IP location", "code", ["ip", "address", "ip_address"], ["Address"], "an IP address"),
    ("phone number", "person", ["name", "person", "contact", "full_name"], ["Full name"], "a person"),
    ("email address", "person", ["name", "person", "contact"], ["Full name of the contact"], "a person"),
    ("birthday", "person", ["name", "person", "friend"], ["Person's name"], "a person"),
    ("office location", "person", ["employee", "name", "colleague"], ["Employee name"], "an employee"),
    ("work schedule", "person", ["employee", "staff_member", "name"], ["Employee name"], "an employee"),
    ("vacation days", "person", ["employee", "name"], ["Employee name"], "an employee"),
    ("user profile", "user", ["username", "user", "handle", "login"], ["User name"], "a user"),
    ("account balance", "user", ["account", "username", "customer"], ["Account name"], "an account"),
    ("permissions", "user", ["username", "user", "principal"], ["User name"], "a user"),
    ("book details", "title", ["title", "book", "book_title"], ["Title of the book"], "a book title"),
    ("film rating", "title", ["title", "film", "movie"], ["Film title"], "a film"),
    ("reviews", "title", ["title", "name", "product"], ["Exact title"], "a title"),
    ("release date", "title", ["title", "name", "work"], ["Title"], "a title"),
    ("episode list", "title", ["show", "series", "title"], ["Name of the series"], "a series"),
    ("board game rules", "title", ["game", "title", "name"], ["Name of the game"], "a board game"),
    ("library availability", "title", ["title", "book"], ["Book title"], "a book"),
    ("word definition", "word", ["word", "term", "headword"], ["The word"], "a word"),
    ("file history", "path", ["path", "file", "filename"], ["Path of the file"], "a file"),
    ("file owner", "path", ["path", "file"], ["File path"], "a file"),
]
assert not [x for x in LOOKUPS if any(b in x[0].lower() for b in _BANNED_WORDS)]
_PLACE_TEMPLATES = [
    "What's the {noun} in {x}?", "Check the {noun} for {x}.", "How is the {noun} in {x} today?", "{Noun} in {x}?",
    "Tell me the {noun} in {x} right now.", "I'm going to {x}. What's the {noun} there?",
    "Can you look up the {noun} for {x}?", "Get the {noun} for {x}, please.", "I need the current {noun} in {x}.",
    "{x}: {noun}?", "Do you know the {noun} in {x}?", "Find out the {noun} in {x} for me.",
    "I'm visiting {x} soon. Can you check the {noun}?", "What are the {noun} like in {x} this week?",
    "{noun} {x}", "My friend lives in {x}. What's the {noun} there?", "Show me the {noun} for {x}.",
]
_OTHER_TEMPLATES = [
    "What's the {noun} for {x}?", "Check the {noun} of {x}.", "Look up {x}: I need the {noun}.",
    "Can you get the {noun} for {x}?", "{Noun} for {x}?", "Show me the {noun} of {x}, please.",
    "I need the {noun} for {x}.", "Please fetch the {noun} of {x}.", "{x}: what's the {noun}?",
    "Find the {noun} for \"{x}\".", "Could you pull up the {noun} for {x}?", "{noun} {x}",
    "What is the {noun} of {x}?", "Get me the {noun} for {x}.",
]
_PLACE_TEMPLATES += ["{x} - {noun}?", "Any info on the {noun} in {x}?", "I'd like to know the {noun} for {x}.",
                     "What about the {noun} in {x} this weekend?", "Quick: {noun} for {x}", "Could you find the {noun} in {x}?",
                     "Is there data on the {noun} in {x}?", "We're driving to {x} tomorrow. How are the {noun} there?"]
_OTHER_TEMPLATES += ["{x} - {noun}?", "Any info on the {noun} of {x}?", "I'd like to know the {noun} for {x}.",
                     "Could you find the {noun} for {x}?", "Need the {noun}: {x}", "{Noun}, {x}, please."]
# Actions: (name verbs, name objects, descriptions, parameters [(names, value kind, description, json type)],
# requests ({p0}, {p1}, ... are the parameters in order), the confirmation).
ACTIONS = [
    (["book", "reserve"], ["table", "table_booking"], ["Reserve a table at a restaurant."],
     [(["restaurant", "venue", "place_name"], "venue", "Restaurant name", "string"),
      (["party_size", "guests", "people", "seats"], "int:1:12", "Number of guests", "integer"),
      (["date", "day", "on_date"], "date", "Date, YYYY-MM-DD", "string")],
     ["Book a table at {p0} for {p1} people on {p2}.", "Reserve {p1} seats at {p0} on {p2}, please.",
      "Can you get us a table for {p1} at {p0} on {p2}?", "Table for {p1} at {p0}, {p2}."],
     "Your table for {p1} at {p0} on {p2} is booked."),
    (["send", "post"], ["message", "chat_message", "sms", "text"], ["Send a short text message to a contact."],
     [(["recipient", "to", "contact", "name"], "person", "Who receives the message", "string"),
      (["text", "message", "body", "content"], "msg", "Message text", "string")],
     ["Send {p0} a message saying \"{p1}\".", "Text {p0}: \"{p1}\"", "Message {p0} that {p1}.",
      "Tell {p0} \"{p1}\" by text."], "Sent to {p0}."),
    (["rename", "move"], ["file", "path"], ["Rename or move a file in the workspace."],
     [(["source", "src", "old_path", "from_path"], "path", "Current path", "string"),
      (["destination", "dst", "new_path", "to_path"], "path", "New path", "string")],
     ["Rename {p0} to {p1}.", "Move {p0} to {p1}.", "mv {p0} {p1}", "Please rename the file {p0} as {p1}."],
     "Moved {p0} to {p1}."),
    (["add"], ["list_item", "to_list", "shopping_item"], ["Add an item to one of the user's lists."],
     [(["item", "entry", "what"], "item", "The item", "string"),
      (["list", "list_name", "collection"], "listname", "Name of the list", "string")],
     ["Add {p0} to my {p1} list.", "Put {p0} on the {p1} list.", "{p1} list: add {p0}.",
      "Please add \"{p0}\" to the list called {p1}."], "Added {p0} to {p1}."),
    (["transfer", "send", "pay"], ["money", "funds", "payment"], ["Transfer money to a bank account."],
     [(["amount", "sum", "value"], "int:5:5000", "Amount in euros", "number"),
      (["account", "iban", "to_account", "recipient_account"], "iban", "Target account (IBAN)", "string")],
     ["Transfer {p0} euros to account {p1}.", "Send {p0} EUR to {p1}.", "Pay {p0} to the account {p1}, please."],
     "Transferred {p0} EUR to {p1}."),
    (["create", "open", "file"], ["ticket", "issue", "bug_report"], ["Open a ticket in the issue tracker."],
     [(["title", "summary", "subject"], "ticket", "Short title", "string"),
      (["priority", "severity", "level"], "enum:low|medium|high|urgent", "Priority", "string")],
     ["Open a ticket \"{p0}\" with {p1} priority.", "File a {p1} priority issue: {p0}.",
      "Create a ticket titled \"{p0}\", priority {p1}."], "Ticket \"{p0}\" created with {p1} priority."),
    (["invite", "add"], ["member", "user", "collaborator"], ["Invite someone to a project by email."],
     [(["email", "address", "invitee"], "email", "E-mail address", "string"),
      (["project", "workspace", "team"], "project", "Project name", "string")],
     ["Invite {p0} to the {p1} project.", "Add {p0} as a member of {p1}.", "Please give {p0} access to {p1}."],
     "Invited {p0} to {p1}."),
    (["set"], ["thermostat", "temperature", "heating"], ["Set the target temperature of a room's thermostat."],
     [(["room", "zone", "area"], "room", "Room", "string"),
      (["temperature", "degrees", "target", "celsius"], "int:15:28", "Target temperature in °C", "integer")],
     ["Set the {p0} to {p1} degrees.", "Make the {p0} {p1} degrees, please.", "Heat the {p0} to {p1}°C.",
      "Thermostat in the {p0}: {p1}."], "The {p0} is set to {p1} degrees."),
    (["book", "reserve"], ["hotel", "room", "stay"], ["Book a hotel room in a city."],
     [(_PLACE[0], "place", "City", "string"), (["check_in", "arrival", "from_date"], "date", "Arrival date", "string"),
      (["nights", "length", "num_nights"], "int:1:14", "Number of nights", "integer")],
     ["Book a hotel in {p0} from {p1} for {p2} nights.", "I need a room in {p0}, arriving {p1}, {p2} nights.",
      "Reserve {p2} nights in {p0} starting {p1}."], "Booked {p2} nights in {p0} from {p1}."),
    (["get", "compute"], ["distance", "driving_distance", "route"], ["Driving distance and time between two places."],
     [(["origin", "start", "from_place"], "place", "Start", "string"),
      (["destination", "end", "to_place"], "place", "End", "string")],
     ["How far is it from {p0} to {p1} by car?", "Driving distance {p0} to {p1}?",
      "How long does it take to drive from {p0} to {p1}?", "Route from {p0} to {p1}, please."],
     "From {p0} to {p1} it is {r} km by road."),
    (["define", "lookup"], ["word", "term"], ["Dictionary definition of a word in a language."],
     [(["word", "term", "headword"], "word", "The word", "string"),
      (["language", "lang", "dictionary"], "lang", "Language of the dictionary", "string")],
     ["What does \"{p0}\" mean in {p1}?", "Define the {p1} word {p0}.", "Look up {p0} in the {p1} dictionary."],
     "\"{p0}\" ({p1}) means <definition>."),
    (["set", "create"], ["reminder", "alarm"], ["Remind the user of something at a given time."],
     [(["text", "what", "note", "label"], "task", "What to remind of", "string"),
      (["time", "at", "when"], "time", "Time, HH:MM", "string")],
     ["Remind me to {p0} at {p1}.", "Set a reminder at {p1}: {p0}.", "At {p1}, remind me to {p0}."],
     "I'll remind you to {p0} at {p1}."),
    (["check", "get"], ["stock_level", "inventory"], ["Units in stock of a product in a warehouse."],
     [(["sku", "product_code", "item_id"], "code", "Product code", "string"),
      (["warehouse", "site", "location"], "place", "Warehouse city", "string")],
     ["How many units of {p0} are in the {p1} warehouse?", "Stock level of {p0} in {p1}?",
      "Check inventory for {p0} at {p1}."], "{p1} has {r} units of {p0}."),
    (["rate", "review"], ["product", "item"], ["Leave a star rating for a product."],
     [(["product", "product_name", "item"], "product", "Product name", "string"),
      (["stars", "rating", "score"], "int:1:5", "Stars, 1 to 5", "integer")],
     ["Give {p0} {p1} stars.", "Rate the {p0} {p1} out of 5.", "I'd like to leave a {p1}-star rating for {p0}."],
     "Rated {p0} with {p1} stars."),
    (["search", "find"], ["jobs", "job_listings", "vacancies"], ["Search job listings by role and city."],
     [(["role", "job_title", "position"], "role", "Job title", "string"), (_PLACE[0], "place", "City", "string")],
     ["Find {p0} jobs in {p1}.", "Any {p0} openings in {p1}?", "Search vacancies for a {p0} in {p1}."],
     "Found {r} {p0} jobs in {p1}."),
    (["log", "record"], ["workout", "exercise", "activity"], ["Log a workout in the fitness diary."],
     [(["activity", "sport", "exercise"], "activity", "Kind of exercise", "string"),
      (["minutes", "duration", "duration_min"], "int:5:180", "Duration in minutes", "integer")],
     ["Log {p1} minutes of {p0}.", "I did {p0} for {p1} minutes, please record it.", "Add a {p1}-minute {p0} workout."],
     "Logged {p1} minutes of {p0}."),
    (["assign"], ["task", "issue", "ticket"], ["Assign a task to a team member."],
     [(["task", "task_title", "item"], "ticket", "Task title", "string"),
      (["assignee", "owner", "person"], "person", "Who takes it", "string")],
     ["Assign \"{p0}\" to {p1}.", "Give the task {p0} to {p1}.", "{p1} should take \"{p0}\". Assign it."],
     "Assigned \"{p0}\" to {p1}."),
    (["order"], ["food", "meal", "takeaway"], ["Order a dish from a restaurant to an address."],
     [(["dish", "meal", "item"], "title", "Name of the dish", "string"),
      (["address", "to_address", "destination"], "address", "Street address", "string")],
     ["Order {p0} to {p1}.", "I'd like {p0} sent to {p1}.", "Get {p0} brought to {p1}, please."],
     "Ordered {p0} to {p1}."),
]
assert not [a for a in ACTIONS for w in a[0] + a[1] if any(b in w for b in _BANNED_WORDS)]
_OTHER_VERBS = {  # verbs of sibling tools that share an object with the right one
    "cancel": "Cancel a pending {obj} request.", "delete": "Delete stored {obj} entries.",
    "archive": "Archive old {obj} entries.", "subscribe": "Subscribe to {obj} alerts.",
    "report": "Report a problem with {obj} data.", "export": "Export {obj} data to a file.",
    "history": "Past {obj} records for a date.", "share": "Share {obj} data with a colleague.",
}


def _slug(words):
    return re.sub(r"[^a-z0-9_]", "", words.lower().replace(" ", "_").replace("-", "_"))


def numbered_name(rng):
    """An opaque tool name: `tool_529`, `svc_12`."""
    return f"{rng.choice(['tool', 'fn', 'api', 'svc', 'op', 'action'])}_{rng.randrange(1, 1000)}"


def _tool_name(rng, verb, obj):
    """A tool name from a verb and an object, in one of many styles (sometimes opaque)."""
    r = rng.random()
    if r < 0.07:
        name = numbered_name(rng)
    elif r < 0.13:
        name = invented_word(rng)
    else:
        name = rng.choice([f"{verb}_{obj}", f"{verb}_{obj}", f"{obj}_{verb}", obj, f"{obj}_{rng.choice(['info', 'api', 'service', 'tool'])}"]) \
            if verb else obj
        if rng.random() < 0.45:
            name = styled(rng, name)
    return name if name not in _HELDOUT_NAMES and heldout_leak(name) is None else f"{verb}_{obj}".strip("_")


def _param_name(rng, names, taken):
    p = rng.choice(names)
    r = rng.random()
    if r < 0.15:
        parts = p.split("_")
        p = parts[0] + "".join(w[:1].upper() + w[1:] for w in parts[1:])
    elif r < 0.27:
        p = rng.choice(["in_", "p_", "arg_", "the_", "x_"]) + p
    elif r < 0.33:
        p = p + rng.choice(["_name", "_value", "_str", "_id", "Value"])
    elif r < 0.38:
        p = rng.choice(["value", "input", "key", "arg0", "q", "param", invented_word(rng)])
    return p if p not in taken else p + str(len(taken) + 1)


def _value(rng, kind):
    if kind.startswith("int:"):
        lo, hi = map(int, kind[4:].split(":"))
        return rng.randrange(lo, hi + 1)
    if kind.startswith("enum:"):
        return rng.choice(kind[5:].split("|"))
    return VALUES[kind](rng)


# Run 12: lookups of a made-up object ("the vikvespol index in Oslo" → get_vikvespol_index(city)),
# beside tools of real objects with the very same parameter. Runs 7–11 picked a tool the request's
# parameter fitted whenever its object was a word no trained tool had (a parcel, music, air
# quality): with about a hundred real objects, each was learnt as a word, not copied as a string.
INVENTED_NOUN_SHARE = 0.4
_NOUN_HEADS = ["index", "level", "status", "count", "report", "score", "forecast", "rate", "schedule", "prices",
               "hours", "times", "data", "", "", ""]


def invented_noun(rng):
    """A made-up object for a lookup: a made-up word, sometimes with a common head noun."""
    head = rng.choice(_NOUN_HEADS)
    return f"{invented_word(rng)} {head}" if head else invented_word(rng)


def invented_lookup(rng, entry=None):
    """A made-up lookup tool: (schema, ask) where ask(rng) gives (request, arguments, result, answer)."""
    noun, kind, pnames, pdescs, what = entry or rng.choice(LOOKUPS)
    if entry is None and rng.random() < INVENTED_NOUN_SHARE:
        noun = invented_noun(rng)
    slug = _slug(noun)
    name = _tool_name(rng, rng.choice(["get", "get", "fetch", "check", "lookup", "query", "find", "show", ""]), slug)
    param = _param_name(rng, pnames, ())
    desc = rng.choice([f"Get the {noun} for {what}.", f"Returns the current {noun} for {what}.",
                       f"Look up the {noun} of {what}.", f"{noun[0].upper() + noun[1:]} for {what}.",
                       f"Fetches {noun} data for {what}.", f"{noun[0].upper() + noun[1:]} lookup."])
    props = {param: s(rng.choice(pdescs))}
    if rng.random() < 0.2:  # an optional parameter the request does not fill
        extra = rng.choice(["language", "limit", "verbose", "format", "date"])
        props[extra] = {"language": s("Answer language"), "limit": n("Maximum number of results", "integer"),
                        "verbose": {"type": "boolean", "description": "More detail"},
                        "format": s("Output format", enum=["text", "json"]), "date": s("Date, YYYY-MM-DD")}[extra]
    schema = tool(name, desc, props, [param])
    templates = _PLACE_TEMPLATES if kind == "place" else _OTHER_TEMPLATES

    def ask(rng):
        x = _value(rng, kind)
        t = rng.choice(templates)
        t = sloppy(rng, other_lead(rng, t) if rng.random() < 0.15 else t)
        q = t.format(noun=noun, Noun=noun[0].upper() + noun[1:], x=x)
        v = rng.choice([str(rng.randrange(0, 1000)), invented_word(rng), f"{rng.randrange(1, 100)}%", "<value>",
                        rng.choice(["high", "low", "moderate", "open", "closed", "none"])])
        return q, {param: x}, {slug: v}, rng.choice([f"The {noun} for {x} is {v}.", f"{x}: {v}.",
                                                      f"The {noun} in {x}: {v}."]), f"the {noun} for {x}"
    return schema, ask, noun


def invented_action(rng, entry=None):
    """A made-up action tool with 2-3 parameters: (schema, ask)."""
    verbs, objs, descs, params, templates, confirm = entry or rng.choice(ACTIONS)
    verb, obj = rng.choice(verbs), rng.choice(objs)
    name = _tool_name(rng, verb, obj)
    names, props = [], {}
    for pn, kind, pdesc, jtype in params:
        p = _param_name(rng, pn, names)
        names.append(p)
        d = {"type": jtype, "description": pdesc}
        if kind.startswith("enum:"):
            d["enum"] = kind[5:].split("|")
        props[p] = d
    schema = tool(name, rng.choice(descs), props, list(names))

    def ask(rng):
        vals = [_value(rng, kind) for _, kind, _, _ in params]
        t = rng.choice(templates)
        t = sloppy(rng, other_lead(rng, t) if rng.random() < 0.15 else t)
        q = t.format(**{f"p{i}": v for i, v in enumerate(vals)})
        r = rng.randrange(2, 900)
        return q, dict(zip(names, vals)), {"status": "ok", "id": invented_code(rng), "value": r}, \
            confirm.format(r=r, **{f"p{i}": v for i, v in enumerate(vals)}), f"to {verb} a {obj.replace('_', ' ')}"
    return schema, ask, obj.replace("_", " ")


_AFFIXES = re.compile(r"^(?:(?:get|fetch|check|lookup|query|find|show|read|search|run|convert|create|send|add|set|list|"
                      r"write|git|my|api|tool|svc|do|current|start|view|open|file|dir|the)(?:[_-]|(?=[A-Z])))+|"
                      r"(?:[_-](?:info|api|service|tool|v2|lookup|search|add|convert|write|read|send|list|get))+$")


def sibling_tools(rng, schema, words=None):
    """Distractors sharing words with a tool's name: another verb on the same object
    (get_humidity beside subscribe_humidity and humidity_history)."""
    name = schema["function"]["name"]
    if words is None:
        core = _AFFIXES.sub("", name) or name
        words = re.sub(r"([a-z])([A-Z])", r"\1 \2", core).replace("_", " ").replace("-", " ").lower().strip()
    core = _slug(words)
    param = next(iter(schema["function"]["parameters"]["properties"]))
    out = []
    for verb in rng.sample(list(_OTHER_VERBS), rng.randrange(1, 3)):
        sib = rng.choice([f"{verb}_{core}", f"{core}_{verb}", styled(rng, f"{verb}_{core}")])
        if sib == name or heldout_leak(sib) is not None or sib in _HELDOUT_NAMES:
            continue
        props = {param: s("Which one")} if verb != "history" else {param: s("Which one"), "date": s("Date, YYYY-MM-DD")}
        if verb in ("cancel", "delete", "archive"):
            props = {"id": s("Identifier of the entry")}
        out.append(tool(sib, _OTHER_VERBS[verb].format(obj=words), props, list(props)))
    return out


_VERB_RE = re.compile(r"^(?:(?:my|api|tool|svc|do)[_-]?)?(get|fetch|check|lookup|query|find|show|search|list|read|"
                      r"run|send|add|set|create|convert|current|book|open|start)(?:[_-]|(?=[A-Z]))", re.I)
_LOOKUP_VERBS = {"get", "fetch", "check", "lookup", "query", "find", "show", "search", "list", "read", "current"}


def _joined_like(name, words):
    """Words joined the way `name` joins its own: kebab-case, camelCase or snake_case."""
    if "-" in name:
        return "-".join(words)
    if re.search(r"[a-z][A-Z]", name):
        return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])
    return "_".join(words)


def contrast_tools(rng, schema, k):
    """Run 7: distractors cut from the right tool's pattern: its verb and naming style, its very
    parameters (names, types, descriptions), another object; only the object word of the name and
    the description tells them apart (get_weather(city) beside get_tide_times(city) and
    get_humidity(city); send_email beside send_sms)."""
    f = schema["function"]
    m = _VERB_RE.match(f["name"])
    verb = m.group(1).lower() if m else rng.choice(["get", "get", "fetch", "check", "find", "show"])
    right = set(re.findall(r"[a-z]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", f["name"]).lower()))
    if verb in _LOOKUP_VERBS or rng.random() < 0.3:
        # Run 12: made-up objects among the real ones, as the right tool's may be.
        nouns = [invented_noun(rng) if rng.random() < INVENTED_NOUN_SHARE / 2 else noun
                 for noun, *_ in rng.sample(LOOKUPS, 2 * k)]
        objects = [(noun, rng.choice([f"Get the {noun}.", f"Returns the current {noun}.", f"{noun[0].upper() + noun[1:]} lookup.",
                                      f"Look up the {noun}.", f"Fetches {noun} data."])) for noun in nouns]
    else:
        objects = [(o.replace("_", " "), rng.choice(a[2])) for a in rng.sample(ACTIONS, min(len(ACTIONS), 2 * k))
                   for o in [rng.choice(a[1])]]
    out = []
    for noun, desc in objects:
        words = [verb] + _slug(noun).split("_")
        if set(words[1:]) & right:
            continue
        name = _joined_like(f["name"], words)
        if name in _HELDOUT_NAMES or heldout_leak(name) is not None or name == f["name"]:
            continue
        params = json.loads(json.dumps(f["parameters"]))
        fn = {"name": name}
        if "description" in f or rng.random() < 0.3:
            fn["description"] = desc
        fn["parameters"] = params
        out.append({"type": "function", "function": fn})
        if len(out) == k:
            break
    return out


def invented_tool(rng):
    schema, ask, words = invented_lookup(rng) if rng.random() < 0.55 else invented_action(rng)
    fn = schema["function"]
    if rng.random() < 0.15:  # as some APIs write them: no description, or none on the parameters
        del fn["description"]
    if rng.random() < 0.2:
        for spec in fn["parameters"]["properties"].values():
            spec.pop("description", None)
    return schema, ask, words


def sloppy(rng, t):
    """A template as users type it: a typo, lower case or no final punctuation (never in a {slot})."""
    if rng.random() < 0.12:
        t = typo(rng, t)
    if rng.random() < 0.12:
        t = "".join(p if p.startswith("{") else p.lower() for p in _slot_split(t))
    elif rng.random() < 0.1:
        t = t[0].lower() + t[1:]
    if rng.random() < 0.15 and t[-1] in ".?!":
        t = t[:-1]
    return t


def _call_reasoning(rng, name, args, what):
    vals = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return rng.choice(["", "", f"I should call {name}.", f"The user wants {what}; {name} does that.",
                       f"{name} fits. Arguments: {vals}.", f"I'll call {name} with {vals}."])


def opaque_names(rng, tools):
    """Run 9: every offered tool renamed to an opaque name (`tool_529`, a made-up word), in
    place: only the descriptions and the parameters tell the right tool from the others, as
    for a held-out tool whose name the model never saw."""
    taken = set()
    for t in tools:
        while True:
            name = numbered_name(rng) if rng.random() < 0.5 else invented_word(rng)
            if name not in taken and name not in _HELDOUT_NAMES and heldout_leak(name) is None:
                break
        taken.add(name)
        t["function"]["name"] = name


def gen_tool_synth(rng):
    """The right tool invented for this conversation, among invented distractors (some sharing
    its words), tools of the fixed set (renamed, or under their own schemas), or nothing; sometimes a second request for
    another offered tool follows."""
    schema, ask, words = invented_tool(rng)
    k = rng.choice([0, 0, 1, 2, 2, 3, 3, 4, 5, 6])
    asks, others = [], []
    if k:
        if rng.random() < 0.4:
            others += sibling_tools(rng, schema, words)
        if rng.random() < 0.45:  # run 7: same verb and parameters, another object
            others += contrast_tools(rng, schema, rng.randrange(1, 3))
        for _ in range(rng.randrange(0, k + 1)):
            o_schema, o_ask, _ = invented_tool(rng)
            others.append(o_schema)
            asks.append((o_schema, o_ask))
        others += [variant(rng, t, [])[0] for t, _ in rng.sample(TOOLS, rng.randrange(0, 3))]
    # Run 10: known tools under their own schemas beside the invented right one, as clients
    # offer them beside a tool the model never saw (a held-out `track_package` among
    # `get_stock_price` and `read_file`): a known name is no sign of the right tool.
    # Copies: `opaque_names` below renames the offered tools in place.
    known = [copy.deepcopy(t) for t, _ in rng.sample(TOOLS, rng.randrange(1, 4))] if rng.random() < 0.5 else []
    names, tools = set(), []
    for t in [schema] + others[:max(k, 1)] + known:
        if t["function"]["name"] not in names:
            names.add(t["function"]["name"])
            tools.append(t)
    rng.shuffle(tools)
    if len(tools) > 1 and rng.random() < 0.2 and all("description" in t["function"] for t in tools):
        opaque_names(rng, tools)
    messages = []
    rounds = [(schema, ask)]
    asks = [(t, a) for t, a in asks if t in tools]
    if asks and rng.random() < 0.2:
        rounds.append(rng.choice(asks))
    for i, (sch, a) in enumerate(rounds):
        q, args, result, answer, what = a(rng)
        name = sch["function"]["name"]
        if i == 0:
            q = with_context(rng, "train", q)
            if rng.random() < 0.05:
                q = named_request(rng, name, args, q)
        messages += [{"role": "user", "content": q},
                     assistant("", _call_reasoning(rng, name, args, what), [(name, args)])]
        if i + 1 < len(rounds) or rng.random() < 0.7:
            messages.append({"role": "tool", "content": json.dumps(result, ensure_ascii=False)})
            messages.append(assistant(answer, rng.choice(["", "", "The tool answered; I'll report its result."])))
        else:
            break
    return conv("tool", maybe_system(rng, messages, 0.3), tools)


def slug_key(noun):
    return noun.lower().replace(" ", "_")


WEATHER_DAYS = ["Weather in {city} for {days} days?", "{days}-day forecast for {city}, please.",
                "What's the weather in {city} over the next {days} days?", "Forecast for {city}, {days} days.",
                "How will the weather be in {city} for the next {days} days?"]


def named_request(rng, name, args, q):
    """The request names the tool to use ("Use get_weather for Oslo.")."""
    forms = [f"Use {name}: {q}", f"{q} Use {name}.", f"Use the {name} tool. {q}", f"{q} (call {name})"]
    if len(args) == 1:
        v = next(iter(args.values()))
        forms += [f"Use {name} for {v}.", f"Call {name} with {v}.", f"use {name} for {v}", f"Run {name} on {v}."]
    return rng.choice(forms)


def _with_days(rng, schema, q, args, result):
    """get_weather with a number of days (the SDK tests' schema has `days`)."""
    c, d = args["city"], rng.randrange(1, 8)
    f = schema["function"]
    props = dict(f["parameters"]["properties"])
    props["days"] = rng.choice([{"type": "integer", "description": "Number of days", "minimum": 1, "maximum": 7},
                                {"type": "integer"}, {"type": "integer", "description": "Days of forecast"}])
    req = ["city", "days"] if rng.random() < 0.5 else ["city"]
    schema = tool(f["name"], rng.choice([f["description"], "Weather forecast"]), props, req)
    q = sloppy(rng, rng.choice(WEATHER_DAYS)).format(city=c, days=d)
    lo = rng.randrange(-5, 20)
    return schema, q, {"city": c, "days": d}, {"city": c, "days": d, "min": lo, "max": lo + rng.randrange(2, 12)}, \
        f"Over the next {d} days {c} will see between {lo} and {lo + 5}°C."


def gen_tool(rng):
    k = 0 if rng.random() < 0.1 else rng.randrange(len(TOOLS))  # weather a little more often
    q, args, result, final = TOOLS[k][1](rng)
    base = TOOLS[k][0]
    if k == 0 and rng.random() < 0.12:
        base, q, args, result, final = _with_days(rng, base, q, args, result)
        final = final.replace(str(result["min"] + 5), str(result["max"]))
    if rng.random() < 0.3:
        # Run 7: the tools under their own schemas (get_weather, get_time, read_file...), as many
        # clients send them, the others too; so the right one shares its verb with several
        # (get_time beside get_weather and get_stock_price).
        schema = base
        others = rng.sample([t for i, (t, _) in enumerate(TOOLS) if i != k], rng.choice([0, 1, 2, 2, 3, 3, 4]))
        tools = others + [schema]
        rng.shuffle(tools)
    else:
        schema, (args,) = variant(rng, base, [args])
        tools = offered_tools(rng, k, schema)
    r = rng.random()
    if r < 0.25:  # invented tools beside it, which it must not be confused with (run 7: 1-2, was 1)
        for _ in range(rng.randrange(1, 3)):
            t = invented_tool(rng)[0]
            if t["function"]["name"] not in {u["function"]["name"] for u in tools}:
                tools.insert(rng.randrange(len(tools) + 1), t)
    elif r < 0.4:  # tools whose names share its words (get_weather beside weather_alerts_subscribe)
        for sib in sibling_tools(rng, schema, _AFFIXES.sub("", TOOLS[k][0]["function"]["name"]).replace("_", " ")):
            if sib["function"]["name"] not in {t["function"]["name"] for t in tools}:
                tools.insert(rng.randrange(len(tools) + 1), sib)
    elif r < 0.75:  # run 7: tools cut from its pattern (same verb, same parameters, another object)
        for c in contrast_tools(rng, schema, rng.randrange(1, 4)):
            if c["function"]["name"] not in {t["function"]["name"] for t in tools}:
                tools.insert(rng.randrange(len(tools) + 1), c)
    q = with_context(rng, "train", q)
    name = schema["function"]["name"]
    if rng.random() < 0.07:
        q = named_request(rng, name, args, q)
    vals = ", ".join(f"{a}={json.dumps(v, ensure_ascii=False)}" for a, v in args.items())
    reasoning = rng.choice([
        f"The user wants something that the {name} tool can do. I'll call it with the right arguments.",
        f"I should call {name}.", "", "", f"I'll call {name} with {vals}.", f"{name} fits. Arguments: {vals}.",
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
    if rng.random() < 0.5:
        tools = [variant(rng, t, [])[0] for t, _ in rng.sample(TOOLS, rng.randrange(1, 4))]
    else:
        tools = [invented_tool(rng)[0] for _ in range(rng.randrange(1, 4))]
        tools = [t for i, t in enumerate(tools) if t["function"]["name"] not in {u["function"]["name"] for u in tools[:i]}]
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
# Scoring prompts: the shape /v1/judgments and /v1/systemone send (a fixed instruction, one JSON
# user turn {evidence, criterion, options}, thinking off); the answer is the right option's
# letter alone. Claims are checked against the tables above, so the letter carries the fact.

JUDGE_SYSTEM = ("Apply the supplied criterion to the supplied evidence. Choose exactly one listed option. "
                "Respond with only its uppercase letter, with no explanation or reasoning.")
SLOT_SYSTEM = JUDGE_SYSTEM.replace("uppercase letter", "uppercase slot")
_YES = ["yes", "true", "correct", "yes, it is correct", "The claim is true.", "right", "it holds"]
_NO = ["no", "false", "wrong", "no, it is wrong", "The claim is false.", "incorrect", "it does not hold"]


def _claim(rng):
    """(evidence, criterion, truth) about a sum, a product, a capital, a symbol or legs."""
    kind = rng.randrange(5)
    if kind < 2:
        a, b = rng.randrange(1, 100), rng.randrange(1, 100)
        op, value = ("+", a + b) if kind == 0 else ("*", a * b if a < 13 and b < 13 else None)
        if value is None:
            op, value = "-", a - b
        truth = rng.random() < 0.5
        shown = value if truth else value + rng.choice([-10, -2, -1, 1, 2, 10])
        claim = f"{a} {op} {b} = {shown}"
        evidence = rng.choice([claim, f"The claim: {claim}", f"Anna wrote {claim}.", {"claim": claim}, [claim]])
        criterion = rng.choice([f"Is {claim}?", "Is the claim correct?", "Is the arithmetic right?",
                                "Is the result correct?", f"Does {a} {op} {b} equal {shown}?", "Is it true?"])
        return evidence, criterion, truth
    if kind == 2:
        country, city = rng.choice(list(CAPITALS.items()))
        truth = rng.random() < 0.5
        other = city if truth else rng.choice([c for c in CAPITALS.values() if c != city])
        claim = f"{other} is the capital of {country}."
        evidence = rng.choice([claim, {"country": country, "capital": other}, f"Someone said: {claim}"])
        return evidence, rng.choice(["Is this correct?", f"Is {other} the capital of {country}?", "Is it true?"]), truth
    if kind == 3:
        name, sym = rng.choice(list(ELEMENTS.items()))
        truth = rng.random() < 0.5
        shown = sym if truth else rng.choice([s for s in ELEMENTS.values() if s != sym])
        return (rng.choice([f"The symbol of {name} is {shown}.", {"element": name, "symbol": shown}]),
                rng.choice(["Is the symbol right?", "Is this correct?", f"Is {shown} the symbol of {name}?"]), truth)
    animal, legs = rng.choice(list(ANIMAL_LEGS.items()))
    truth = rng.random() < 0.5
    shown = legs if truth else rng.choice([n for n in (0, 2, 4, 6, 8) if n != legs])
    return (f"A {animal} has {shown} legs.", rng.choice(["Is this true?", f"Does a {animal} have {shown} legs?"]),
            truth)


def _choice(rng):
    """(evidence, criterion, options, right index): the capital's country, or a sum's value."""
    if rng.random() < 0.5:
        country, city = rng.choice(list(CAPITALS.items()))
        others = rng.sample([c for c in CAPITALS if c != country], rng.randrange(1, 5))
        options = others + [country]
        rng.shuffle(options)
        evidence = rng.choice([city, {"city": city}, f"The city is {city}."])
        return evidence, f"Which country is {city} the capital of?", options, options.index(country)
    a, b = rng.randrange(1, 60), rng.randrange(1, 60)
    options = sorted({a + b, a + b + 1, a + b - 1, a + b + 10} if rng.random() < 0.5 else {a + b, a + b + 2, a + b - 3})
    options = [str(o) for o in options]
    return (rng.choice([f"{a} + {b}", {"a": a, "b": b}]), rng.choice(["What is the sum?", f"What is {a} + {b}?"]),
            options, options.index(str(a + b)))


def gen_judgment(rng):
    letters = "ABCDEFGHIJKLMNOP"
    if rng.random() < 0.6:
        evidence, criterion, truth = _claim(rng)
        yes, no = rng.choice(_YES), rng.choice(_NO)
        descriptions, right = ([yes, no], 0 if truth else 1) if rng.random() < 0.7 else ([no, yes], 1 if truth else 0)
        labels = ["true", "false"] if descriptions[0] == yes else ["false", "true"]
    else:
        evidence, criterion, descriptions, right = _choice(rng)
        labels = list(descriptions)
    if rng.random() < 0.5:
        system = JUDGE_SYSTEM
        options = [{"letter": letters[i], "description": d} for i, d in enumerate(descriptions)]
    else:
        system = SLOT_SYSTEM
        options = [{"slot": letters[i], "label": label, "description": d}
                   for i, (label, d) in enumerate(zip(labels, descriptions))]
    payload = {"evidence": evidence}
    if system == JUDGE_SYSTEM or rng.random() < 0.9:
        payload["criterion"] = criterion
    payload["options"] = options
    return conv("judgment", [{"role": "system", "content": system},
                             {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
                             assistant(letters[right])])


# ---------------------------------------------------------------------------------------------

def gen_multiturn(rng):
    """Two or three simple exchanges in one conversation."""
    msgs = []
    for _ in range(rng.randrange(2, 4)):
        c = rng.choice([gen_fact, gen_arith, gen_smalltalk, gen_json])(rng)
        msgs += [m for m in c["messages"] if m["role"] != "system"]
    return conv("multiturn", maybe_system(rng, msgs))


GENERATORS = [  # run 7: tool calls 62 % (was 38 %), the rest replayed at about half its share
    (gen_smalltalk, 5), (gen_fact, 5), (gen_arith, 6), (gen_tool, 20), (gen_tool_synth, 30), (gen_tool_parallel, 3),
    (gen_tool_unneeded, 7), (gen_json, 5), (gen_code, 2), (gen_code_task, 4), (gen_multiturn, 4),
    (gen_judgment, 4),
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


_check_split()  # at the end: the value lists it checks are defined above
