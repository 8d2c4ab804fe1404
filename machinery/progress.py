"""
Progress on stderr, so that stdout holds only results (`python compare.py > summary.md` keeps just the table): a tqdm
bar on a terminal, occasional plain lines in a log file.
"""
import sys
import time

from tqdm import tqdm

PLAIN_EVERY = 30.0  # seconds between plain progress lines when stderr is a log file


class _Lines:
    """stderr for a bar where it is not a terminal (a Slurm output file, a compare run's train.out, a pipe): a
    redrawn bar would fill the log with carriage returns, so a redraw ('\r' + text) only keeps the bar's newest text,
    printed as a plain line once PLAIN_EVERY seconds have passed since the last one, and as the bar closes ('\n').
    A bar closed with leave=False (a command that stops) prints nothing more."""

    def __init__(self):
        self.text, self.shown = None, time.time()

    def write(self, text):
        if text.strip():  # a redraw; tqdm's blank ones clear a bar
            self.text = text.strip()
        if self.text and (text == '\n' or text.strip() and time.time() - self.shown >= PLAIN_EVERY):
            print(self.text, file=sys.stderr, flush=True)
            self.text, self.shown = None, time.time()

    def flush(self):
        pass


def progress_bar(total, desc, initial=0, unit='it', disable=False):
    """A tqdm bar on stderr, redrawn at most twice a second on a terminal; elsewhere its text without the bar (ncols=0)
    as occasional plain lines (_Lines)."""
    tty = sys.stderr.isatty()
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, mininterval=0.5,
                file=sys.stderr if tty else _Lines(), dynamic_ncols=tty, ncols=None if tty else 0)
