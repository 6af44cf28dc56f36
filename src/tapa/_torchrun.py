"""Command-line errors under torchrun, where every process of a launch runs the same command.

A bad flag or setting fails on every rank alike: each would print the same line, and torchrun's
closing report would say only "To enable traceback see ...". `error_for_this_process` makes such a
line print once per host, tagged with the rank that printed it, and hands it to torchrun's error
file so that the report's root cause is that line. The CLI routes every command's error line
through it (tapa.cli.main); no torch import, as the CLI may fail before any.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path


def error_for_this_process(line: str) -> str | None:
    """An error line as this process should print it: as is outside torchrun. Under torchrun with
    more than one process, the line also goes to torchrun's error file (so that its closing report
    names the cause instead of "To enable traceback see ..."), it is printed once per host however
    many ranks fail with it (None for the others: a bad flag fails on every rank alike), and it
    names the rank that printed it."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or "RANK" not in os.environ:
        return line
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            with open(error_file, "w") as handle:
                json.dump({"message": line, "timestamp": int(time.time())}, handle)
        except OSError:
            pass
    launch = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}-{os.environ.get('MASTER_PORT', '')}"
    # an empty file a distinct line and launch, in the temp directory
    user = os.getuid() if hasattr(os, "getuid") else 0
    marks = Path(tempfile.gettempdir()) / f"tapa-torchrun-errors-{user}" / launch
    try:
        marks.mkdir(parents=True, exist_ok=True)
        os.close(os.open(marks / hashlib.sha256(line.encode()).hexdigest()[:16],
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None  # another rank of this launch printed the same line
    except OSError:
        pass  # no place to coordinate: every rank prints
    return f"{line} [rank {os.environ['RANK']} of {world}]"
