"""Command-line configuration in nanoGPT's style (to be completed by the trainer work)."""


class UserError(Exception):
    """A mistake the user can fix: the CLI prints its one-sentence message and exits with status 2."""
