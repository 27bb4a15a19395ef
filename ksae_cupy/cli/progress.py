"""What a training command shows while it runs: :class:`~ksae_cupy.training.progress.RunProgress`
(a bar on a terminal, else a line every few seconds; the ETA; the epoch lines)."""
from ksae_cupy.training.progress import RunProgress  # noqa: F401
from ksae_cupy.training.wording import epoch_line, format_duration  # noqa: F401
