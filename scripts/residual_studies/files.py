"""Small file helpers shared by the tools: JSON and line files written atomically, fingerprints."""
import hashlib
import json
import os


def read_json(path, default=None):
    """The JSON in ``path``, or ``default`` when there is no such file."""
    if not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    """Write ``obj`` as indented JSON, atomically (a temporary file, then a rename)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def write_lines(path, lines):
    """Write one line per item (``\\n`` endings), atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def read_lines(path):
    """The lines of a UTF-8 file without their ``\\n``."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def fingerprint(obj, length=16):
    """A short stable hash of a JSON-serialisable object: the first ``length`` hex digits of the sha256 of its
    JSON with sorted keys (the data fingerprints: 16; the study cells' folder names: 8)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:length]


def file_id(path):
    """Cheap identity of a file that changes when it is rewritten (size, mtime in ns)."""
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"
