"""Corpus archives of the preparation steps: find (or download) an archive, check it is a readable gzip/tar
holding the expected files, extract the wanted members (``fetch``); list the OPUS-100 pair folders an
extracted archive holds (``opus-pairs``).
"""
import contextlib
import os
import re
import shutil
import tarfile
import time
import urllib.request
import zlib

from .corpus_io import PrepError, info

def _offline(args):
    return args.offline or os.environ.get("PREP_OFFLINE", "") not in ("", "0")


def _missing_message(name, archives, url, reason, hint):
    msg = (f"archive '{name}' not found in {archives} ({reason}).\n"
           f"  Get it from {url}\n"
           f"  and put it in {archives} (or pass --archives DIR naming the folder that holds it).")
    if hint:
        msg += f"\n  {hint}"
    return msg


def _download(url, dest, timeout):
    part = dest + ".part"
    info(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, last = 0, 0.0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                now = time.time()
                if now - last > 10:
                    pct = f" ({100 * done / total:.0f}%)" if total else ""
                    info(f"  {done / 2**20:.0f} MiB{pct}")
                    last = now
    except Exception as exc:  # network errors come in many types (URLError, timeout, OSError)
        with contextlib.suppress(OSError):
            os.remove(part)
        return f"{type(exc).__name__}: {exc}"
    os.replace(part, dest)
    info(f"saved {dest}")
    return None


def _norm_member(name):
    while name.startswith("./"):
        name = name[2:]
    return name


def _matches(name, patterns):
    """A pattern ending in '/' is a folder prefix; any other pattern is an exact path."""
    return any(name.startswith(p) if p.endswith("/") else name == p for p in patterns)


def _safe_target(dest, name):
    target = os.path.normpath(os.path.join(dest, name))
    root = os.path.normpath(dest)
    if os.path.isabs(name) or not target.startswith(root + os.sep):
        raise PrepError(f"refusing to extract '{name}' outside {dest}")
    return target


def _extracted_copy(args, archives):
    """Where the archive's required members are already extracted, or None: the ``--dest`` folder, else the
    ``--archives`` folder, whose required files are then copied into ``--dest`` (a required folder, ``x/``, counts
    when it exists and is not empty, in ``--dest`` only: a tree is not copied)."""
    require = [_norm_member(p) for p in args.require]
    if not require:
        return None
    dest = os.path.abspath(args.dest)
    for folder in (dest, archives):
        if folder != dest and any(p.endswith("/") for p in require):
            continue
        if all(os.path.isdir(os.path.join(folder, p)) and os.listdir(os.path.join(folder, p)) if p.endswith("/")
               else os.path.isfile(os.path.join(folder, p)) for p in require):
            if folder != dest:
                for p in require:
                    target = _safe_target(args.dest, p)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copyfile(os.path.join(folder, p), target + ".part")
                    os.replace(target + ".part", target)
            return folder
    return None


def cmd_fetch(args):
    archives = os.path.abspath(args.archives)
    path = os.path.join(archives, args.name)
    if not os.path.isfile(path):
        found = _extracted_copy(args, archives)
        if found:
            info(f"{args.name}: not in {archives}; using its files already extracted in {found}")
            return
        if args.require:
            where, first = os.path.abspath(args.dest), _norm_member(args.require[0])
            hint = (f"(or extract it into {where}: its {first} there)" if any(
                _norm_member(p).endswith("/") for p in args.require) else
                f"(or extract it: {first} and the other files it needs in {where} or {archives})")
            args.hint = f"{args.hint} {hint}" if args.hint else hint
        if _offline(args):
            raise PrepError(_missing_message(args.name, archives, args.url,
                                             "offline mode: not downloading", args.hint))
        os.makedirs(archives, exist_ok=True)
        error = _download(args.url, path, args.timeout)
        if error is not None:
            raise PrepError(_missing_message(args.name, archives, args.url,
                                             f"download failed, {error}", args.hint))

    require = [_norm_member(p) for p in args.require]
    extract = [_norm_member(p) for p in (args.extract or args.require)]
    stat = os.stat(path)
    stamp_key = f"{stat.st_size} {stat.st_mtime_ns} {sorted(extract)}"
    stamp = os.path.join(args.dest, f".{args.name}.extracted")
    on_disk = all(os.path.isfile(os.path.join(args.dest, p)) for p in extract if not p.endswith("/"))
    if os.path.isfile(stamp) and on_disk:
        with open(stamp, encoding="utf-8") as f:
            if f.read() == stamp_key:
                info(f"{args.name}: already extracted into {args.dest}")
                return

    malformed = (f"archive '{path}' is malformed: {{}}.\n"
                 f"  Delete it and download it again from {args.url}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if args.name.endswith((".tgz", ".tar.gz")) and magic[:2] != b"\x1f\x8b":
        kind = "an HTML page" if magic.lstrip()[:1] == b"<" else "something else"
        raise PrepError(malformed.format(f"not a gzip-compressed tar file (it looks like {kind})"))

    info(f"{args.name}: checking and extracting into {args.dest}")
    os.makedirs(args.dest, exist_ok=True)
    seen, extracted = set(), 0
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = _norm_member(member.name)
                seen.add(name)
                if not member.isfile() or not _matches(name, extract):
                    continue
                target = _safe_target(args.dest, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(member)
                with open(target + ".part", "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(target + ".part", target)
                extracted += 1
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise PrepError(malformed.format(f"not a readable tar archive or truncated ({exc})"))

    missing = [p for p in require
               if not (any(n.startswith(p) for n in seen) if p.endswith("/") else p in seen)]
    if missing:
        listing = "\n".join(f"    {m}" for m in missing)
        raise PrepError(f"archive '{path}' does not contain the expected file(s):\n{listing}\n"
                        f"  Is it the right archive? The recipe expects the one from {args.url}")
    info(f"{args.name}: extracted {extracted} file(s)")
    with open(os.path.join(args.dest, f".{args.name}.listing"), "w", encoding="utf-8") as f:
        f.write("".join(f"{n}\n" for n in sorted(seen)))  # what it holds, extracted or not
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(stamp_key)



# OPUS-100 pair folders


def _pair_lang(entry):
    """'de', 'en-de' or 'de-en' -> 'de'."""
    parts = entry.strip().split("-")
    others = [p for p in parts if p != "en"]
    if len(parts) > 2 or len(others) != 1 or not others[0]:
        raise PrepError(f"bad language pair '{entry}': use 'xx', 'en-xx' or 'xx-en'")
    return others[0]


def parse_pairs(text):
    return [_pair_lang(e) for e in re.split(r"[,\s]+", text or "") if e.strip()]


def _archive_pairs(listing):
    """The non-English languages of the pair folders (``.../en-xx/`` or ``.../xx-en/``) an archive's member list
    names, sorted; None without a list."""
    if not listing or not os.path.isfile(listing):
        return None
    langs = set()
    with open(listing, encoding="utf-8") as f:
        for name in f:
            for part in name.strip().split("/")[:-1]:
                pair = part.split("-")
                if len(pair) == 2 and "en" in pair and pair[0] != pair[1] and all(p.isalpha() for p in pair):
                    langs.add(pair[1] if pair[0] == "en" else pair[0])
    return sorted(langs)


def cmd_opus_pairs(args):
    if args.langs_only:
        langs = list(dict.fromkeys(parse_pairs(args.pairs)))
        if not langs:
            raise PrepError("empty --pairs list")
        print(" ".join(langs))
        return
    root = args.root
    if not root:
        raise PrepError("opus-pairs needs --root")
    found = {}
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        parts = name.split("-")
        if len(parts) != 2 or "en" not in parts or parts[0] == parts[1]:
            continue
        lang = parts[1] if parts[0] == "en" else parts[0]
        if all(os.path.isfile(os.path.join(root, name, f"opus.{name}-train.{l}"))
               for l in ("en", lang)):
            found[lang] = name
    wanted = parse_pairs(args.pairs) if args.pairs else sorted(found)
    missing = [l for l in wanted if l not in found]
    if missing:
        available = f"\n  extracted: {' '.join(sorted(found)) or '(none)'}"
        held = _archive_pairs(getattr(args, "listing", None))
        if held is not None:
            available = f"\n  the archive holds: {' '.join(held) or '(none)'}"
        raise PrepError(f"language pair(s) not in {root}: {', '.join('en-' + l for l in missing)}{available}")
    if not wanted:
        raise PrepError(f"no OPUS-100 pair folders (opus.xx-en-train.xx ...) under {root}")
    for lang in dict.fromkeys(wanted):
        name = found[lang]
        for split in ("dev", "test"):
            if not all(os.path.isfile(os.path.join(root, name, f"opus.{name}-{split}.{l}"))
                       for l in ("en", lang)):
                info(f"warning: {name} has no {split} set (train only)")
        print(f"{name} {lang}")

