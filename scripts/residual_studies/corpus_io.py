"""Text files of the corpus preparation steps: the user error of a step, its progress line, and reading and
writing text as the Perl and awk tools of the original recipes do.

Files are read as UTF-8 (undecodable bytes replaced) and split on "\\n" only; "-" means stdin / stdout.
"""
import contextlib
import os
import sys

from .runner import ToolError

PROG = "corpus"


class PrepError(ToolError):
    """A preparation step that cannot go on, with a message meant for the user (printed as 'ERROR: ...',
    exit code 2)."""


def info(msg):
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# text I/O


@contextlib.contextmanager
def open_in(path):
    if path == "-":
        stream = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", newline="\n",
                      closefd=False)
    else:
        if not os.path.isfile(path):
            raise PrepError(f"input file not found: {path}")
        stream = open(path, encoding="utf-8", errors="replace", newline="\n")
    try:
        yield stream
    finally:
        stream.close()


@contextlib.contextmanager
def open_out(path, append=False):
    if path == "-":
        stream = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)
    else:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        stream = open(path, "a" if append else "w", encoding="utf-8", newline="\n")
    try:
        yield stream
    finally:
        stream.close()


def iter_lines(stream):
    """Lines without their trailing newline (Perl chomp); only "\\n" ends a line."""
    for line in stream:
        yield line[:-1] if line.endswith("\n") else line


def iter_file_lines(paths):
    for path in paths:
        with open_in(path) as stream:
            yield from iter_lines(stream)


def chunks(lines, size):
    """Lists of at most ``size`` consecutive lines."""
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
