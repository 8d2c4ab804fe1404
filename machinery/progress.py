"""
Progress on stderr, so that stdout holds only results (`python compare.py > summary.md` keeps just the table): a tqdm
bar on a terminal, occasional plain lines in a log file.
"""
import sys
import time

from tqdm import tqdm

PLAIN_EVERY = 30.0  # seconds between plain progress lines when stderr is a log file


def progress_bar(total, desc, initial=0, unit='it', disable=False):
    """A tqdm bar on stderr, redrawn at most twice a second, when stderr is a terminal. When it is not (a Slurm
    output file, a compare run's train.out, a pipe), a redrawn bar would fill the log with carriage returns: a
    PlainProgress prints one plain line every PLAIN_EVERY seconds and one at the end instead."""
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=sys.stderr,
                    mininterval=0.5, dynamic_ncols=True)
    return PlainProgress(total, desc, initial, unit, disable)


class PlainProgress:
    """The part of tqdm's interface the scripts use, as occasional whole lines on stderr."""

    def __init__(self, total, desc, initial=0, unit='it', disable=False):
        self.total, self.desc, self.unit, self.disable = total, desc, unit, disable
        self.n = self.initial = initial
        self.postfix, self.t0, self.leave = '', time.time(), True  # leave=False: no closing line, as tqdm's
        self.shown_t, self.shown_n = self.t0, initial

    def update(self, n=1):
        self.n += n
        if time.time() - self.shown_t >= PLAIN_EVERY:
            self.show()

    def set_description(self, desc):
        self.desc = desc

    def set_postfix_str(self, postfix):
        self.postfix = postfix

    def set_postfix(self, **values):
        self.postfix = ', '.join(f'{k}={v}' for k, v in values.items())

    @staticmethod
    def write(line, file=None):
        """As tqdm.write: a message line, on stdout unless a file is given."""
        print(line, file=file or sys.stdout, flush=True)

    def show(self):
        self.shown_t, self.shown_n = time.time(), self.n
        if not self.disable:  # tqdm's own format, without the bar (ncols=0)
            print(tqdm.format_meter(self.n, self.total, self.shown_t - self.t0, ncols=0, prefix=self.desc,
                                    unit=self.unit, postfix=self.postfix or None, initial=self.initial),
                  file=sys.stderr, flush=True)

    def close(self):
        if self.leave and self.n != self.shown_n:  # where it ended, unless the last line already said so
            self.show()
