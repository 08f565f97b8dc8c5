"""Resumable steps: a step's settings stamp and done marker, so that a tool run again reuses what a
previous run finished with the same settings."""
import os
import shutil

from .files import read_json, write_json
from .runner import ToolError, logger, rel

log = logger("demo")


class Step:
    """A step's settings stamp (``settings.json``) and done marker (``done.json``) in ``folder``.

    ``check()`` returns True when the step finished earlier with the same settings (reuse it). A
    finished step whose settings differ is an error unless ``overwrite`` (then it is redone); the error
    ends with ``hint(folder, diff)`` when given (the tool's own advice), else it suggests ``--overwrite``;
    ``cheap`` steps (derived results) are redone without asking. A step that ``owns`` its folder
    empties it before it is redone; other steps (translation, in a training run's folder) only
    drop their own marker.
    """

    def __init__(self, folder, name, settings, overwrite=False, cheap=False, owns=True,
                 files=("settings.json", "done.json"), hint=None):
        self.folder, self.name, self.settings, self.hint = folder, name, settings, hint
        self.overwrite, self.cheap, self.owns = overwrite, cheap, owns
        self.stamp = os.path.join(folder, files[0])
        self.done_path = os.path.join(folder, files[1])

    def diff(self):
        old = read_json(self.stamp)
        if old is None:
            return None
        keys = sorted(set(old) | set(self.settings))
        return {k: (old.get(k), self.settings.get(k)) for k in keys if old.get(k) != self.settings.get(k)}

    def done(self):
        return os.path.exists(self.done_path)

    def check(self, resumable=()):
        """True: reuse. False: (re)do; the folder then holds the new stamp and no done marker.

        ``resumable``: keys allowed to change without redoing from scratch (the caller resumes).
        """
        diff = self.diff()
        if diff == {} and self.done():
            return True
        if diff and self.done() and not set(diff) <= set(resumable) and not (self.cheap or self.overwrite):
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in
                                ((k, *v) for k, v in diff.items()))
            advice = (self.hint(self.folder, diff) if self.hint else
                      "Use another --out folder, or pass --overwrite to redo this step")
            raise ToolError(f"{rel(self.folder)} ({self.name}) was finished with other settings ({changes}). "
                            f"{advice}.")
        if diff and not set(diff) <= set(resumable):
            log(f"{self.name}: settings changed ({', '.join(diff)}); redoing it")
            if self.owns and os.path.isdir(self.folder):
                shutil.rmtree(self.folder)
        os.makedirs(self.folder, exist_ok=True)
        if os.path.exists(self.done_path):
            os.remove(self.done_path)
        write_json(self.stamp, self.settings)
        return False

    def finish(self, info=None):
        write_json(self.done_path, info or {})

    def info(self):
        return read_json(self.done_path, {})
