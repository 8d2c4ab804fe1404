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
    redrawn bar would fill the log with carriage returns, so a redraw ('\\r' + text) is a plain line once PLAIN_EVERY
    seconds have passed since the last one, and the bar's close ('\\n') one more where the bar moved since. A bar
    closed with leave=False (a command that stops) prints nothing more: tqdm's blank redraws clear a bar."""

    def __init__(self):
        self.bar, self.text, self.shown, self.shown_n = None, '', time.time(), None

    def write(self, text):
        self.text = text.strip() or self.text  # the bar's newest text
        if text.strip():
            due = time.time() - self.shown >= PLAIN_EVERY
        else:
            due = text == '\n' and self.bar is not None and self.bar.n != self.shown_n
        if due:
            print(self.text, file=sys.stderr, flush=True)
            self.shown, self.shown_n = time.time(), self.bar.n

    def flush(self):
        pass


def progress_bar(total, desc, initial=0, unit='it', disable=False):
    """A tqdm bar on stderr, redrawn at most twice a second on a terminal; elsewhere its text without the bar (ncols=0)
    as occasional plain lines (_Lines)."""
    tty, lines = sys.stderr.isatty(), _Lines()
    bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, mininterval=0.5,
               file=sys.stderr if tty else lines, dynamic_ncols=tty, ncols=None if tty else 0,
               position=None if tty else 0)  # lines: no moving between the rows of several bars
    lines.bar = bar  # its count tells whether a closing line would say something new
    return bar
