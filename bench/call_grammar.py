#!/usr/bin/env python3
"""What holding `auto` tool calls to the offered tools costs per request: the call grammar is
compiled (and its first mask computed) for every request that offers tools.

    .venv/bin/python bench/call_grammar.py --url http://127.0.0.1:8000 [--model NAME] [-n 20]

Sends the same one-token chat request with an agent-sized tool list (16 tools shaped like a
coding agent's: shell, files, search, edits with nested arrays, todos, web) under
`tool_choice: "auto"` (grammar built) and `"none"` (no tools shown, no grammar), alternating,
and prints the median wall time of each and their difference. Run it against a model with the
real 248K-token vocabulary (the grammar's token tables are the vocabulary's) to see the cost a
real checkpoint pays.
"""

import argparse
import statistics
import time

import httpx


def s(desc, **kw):
    return {"type": "string", "description": desc, **kw}


def tool(name, desc, props, required):
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOLS = [
    tool("Bash", "Run a shell command", {"command": s("The command"), "timeout": {"type": "integer", "maximum": 600000},
                                         "description": s("What it does"), "run_in_background": {"type": "boolean"}},
         ["command"]),
    tool("Read", "Read a file", {"file_path": s("Absolute path"), "offset": {"type": "integer"}, "limit": {"type": "integer"}},
         ["file_path"]),
    tool("Write", "Write a file", {"file_path": s("Absolute path"), "content": s("The content")}, ["file_path", "content"]),
    tool("Edit", "Replace a string in a file", {"file_path": s("Path"), "old_string": s("Text to replace"),
                                                "new_string": s("Replacement"), "replace_all": {"type": "boolean"}},
         ["file_path", "old_string", "new_string"]),
    tool("MultiEdit", "Several edits to one file", {"file_path": s("Path"), "edits": {"type": "array", "minItems": 1, "items": {
        "type": "object", "properties": {"old_string": s("Old"), "new_string": s("New"), "replace_all": {"type": "boolean"}},
        "required": ["old_string", "new_string"]}}}, ["file_path", "edits"]),
    tool("Glob", "Find files by pattern", {"pattern": s("Glob pattern"), "path": s("Directory")}, ["pattern"]),
    tool("Grep", "Search file contents", {"pattern": s("Regex"), "path": s("Path"), "glob": s("Filter"),
                                          "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                                          "-i": {"type": "boolean"}, "-n": {"type": "boolean"}, "head_limit": {"type": "number"}},
         ["pattern"]),
    tool("LS", "List a directory", {"path": s("Absolute path"), "ignore": {"type": "array", "items": {"type": "string"}}}, ["path"]),
    tool("TodoWrite", "Update the todo list", {"todos": {"type": "array", "items": {"type": "object", "properties": {
        "content": s("Task", minLength=1), "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
        "id": s("Id")}, "required": ["content", "status", "id"]}}}, ["todos"]),
    tool("WebFetch", "Fetch a URL", {"url": s("URL", format="uri"), "prompt": s("What to extract")}, ["url", "prompt"]),
    tool("WebSearch", "Search the web", {"query": s("Query", minLength=2), "allowed_domains": {"type": "array", "items": {"type": "string"}},
                                         "blocked_domains": {"type": "array", "items": {"type": "string"}}}, ["query"]),
    tool("NotebookEdit", "Edit a notebook cell", {"notebook_path": s("Path"), "cell_id": s("Cell"), "new_source": s("Source"),
                                                  "cell_type": {"type": "string", "enum": ["code", "markdown"]},
                                                  "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]}},
         ["notebook_path", "new_source"]),
    tool("Task", "Start a sub-agent", {"description": s("Short description"), "prompt": s("The task"),
                                       "subagent_type": s("Agent type")}, ["description", "prompt", "subagent_type"]),
    tool("ExitPlanMode", "Leave plan mode", {"plan": s("The plan")}, ["plan"]),
    tool("BashOutput", "Read a background shell's output", {"bash_id": s("Shell id"), "filter": s("Regex")}, ["bash_id"]),
    tool("KillShell", "Stop a background shell", {"shell_id": s("Shell id")}, ["shell_id"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model")
    ap.add_argument("-n", type=int, default=20)
    a = ap.parse_args()
    body = {"messages": [{"role": "user", "content": "List the files in src and fix the failing test."}],
            "max_tokens": 1, "temperature": 0, "tools": TOOLS}
    if a.model:
        body["model"] = a.model
    times = {"auto": [], "none": []}
    with httpx.Client(base_url=a.url, timeout=300) as c:
        for choice in ("auto", "none"):  # warm-up: token tables, template, prefix cache
            c.post("/v1/chat/completions", json={**body, "tool_choice": choice}).raise_for_status()
        for _ in range(a.n):
            for choice in ("auto", "none"):
                t = time.perf_counter()
                c.post("/v1/chat/completions", json={**body, "tool_choice": choice}).raise_for_status()
                times[choice].append((time.perf_counter() - t) * 1e3)
    auto, none = statistics.median(times["auto"]), statistics.median(times["none"])
    print(f"{len(TOOLS)} tools, {a.n} requests each: auto {auto:.1f} ms, none {none:.1f} ms (median); "
          f"the call grammar adds {auto - none:.1f} ms a request")


if __name__ == "__main__":
    main()
