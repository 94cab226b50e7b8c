"""Which files of a `--code` directory go into its snapshot: everything but what `.gitignore` and
`.corralignore` files (at any depth, gitignore syntax: `*`, `**`, `?`, `[...]`, a leading `/`
anchors, a trailing `/` means directories, `!` re-includes) exclude, and never `.git/`. Symlinks
are refused (they would point outside the snapshot). Client side, standard library only."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".gitignore", ".corralignore")


@dataclass(frozen=True, slots=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    base: str  # the dir (relative, "" = top) whose ignore file holds it


@dataclass(frozen=True, slots=True)
class CodeFile:
    path: str  # relative, '/'-separated
    abs_path: Path
    size: int
    executable: bool


class CodeDirError(ValueError):
    pass


def _translate(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == len(pattern):
            out += "/.*"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out += re.escape(c)
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
                i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return out


def parse_rules(text: str, base: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = re.compile(("^" if anchored else "^(?:.*/)?") + body + "$")
        rules.append(Rule(regex, negate, dir_only, base))
    return rules


def ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    verdict = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.base and not rel.startswith(rule.base + "/"):
            continue
        local = rel[len(rule.base) + 1 :] if rule.base else rel
        if rule.regex.match(local):
            verdict = not rule.negate
    return verdict


def scan(top: Path) -> list[CodeFile]:
    """The files of `top` that a snapshot holds, sorted by path."""
    if not top.is_dir():
        raise CodeDirError(f"--code {top}: not a directory")
    found: list[CodeFile] = []
    rules: list[Rule] = []

    def walk(rel_dir: str) -> None:
        here = top / rel_dir if rel_dir else top
        for name in IGNORE_FILES:
            f = here / name
            if f.is_file():
                rules.extend(parse_rules(f.read_text(errors="replace"), rel_dir))
        with os.scandir(here) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                st = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                if entry.name == ".git" or ignored(rules, rel, is_dir):
                    continue
                if stat.S_ISLNK(st.st_mode):
                    raise CodeDirError(f"--code: {rel} is a symlink; snapshots hold plain files only")
                # Python holds a name's non-UTF-8 bytes as lone surrogates: no manifest carries them.
                if any(0xD800 <= ord(c) <= 0xDFFF for c in entry.name):
                    shown = rel.encode("utf-8", "backslashreplace").decode()
                    raise CodeDirError(f"--code: {shown} has a name that is not UTF-8; rename it")
                if is_dir:
                    walk(rel)
                elif stat.S_ISREG(st.st_mode):
                    found.append(CodeFile(rel, Path(entry.path), st.st_size, bool(st.st_mode & 0o111)))

    walk("")
    return found
