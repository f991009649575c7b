"""TensorBoard: a report's figures as scalars and its findings as text in an event file of a log folder, its HTML
page a file beside it."""

from __future__ import annotations

from pathlib import Path

from loaderdoctor.errors import UsageError
from loaderdoctor.integrations.trackers.summary import Summary
from loaderdoctor.integrations.trackers.tracker import METRIC_PREFIX, require

DEFAULT_LOG_DIR = Path("runs") / "loaderdoctor"


class TensorBoardTracker:
    """Writes to an event file in `log_dir` (default ./runs/loaderdoctor, as `tensorboard --logdir runs` reads it)
    at `step`, and the HTML page to loaderdoctor-KIND.html there."""

    name = "tensorboard"

    def __init__(self, *, log_dir: str | Path = DEFAULT_LOG_DIR, step: int = 0) -> None:
        self.log_dir = Path(log_dir).expanduser()
        self.step = step

    def log(self, summary: Summary, page: str) -> str:
        require("tensorboard", self.name)
        from torch.utils.tensorboard import SummaryWriter

        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            page_path = self.log_dir / f"loaderdoctor-{summary.kind}.html"
            page_path.write_text(page, encoding="utf-8")
        except OSError as error:
            raise UsageError(
                f"cannot write to the TensorBoard folder {self.log_dir}: {error.strerror or error}",
                hint="give a log folder you may write to",
            ) from None
        writer = SummaryWriter(log_dir=str(self.log_dir))
        try:
            for key, value in summary.figures.items():
                writer.add_scalar(METRIC_PREFIX + key, value, self.step)
            # Indented, TensorBoard's markdown shows every line as written: a title is never read as markup.
            text = "\n".join("    " + line for line in summary.findings_text().splitlines())
            writer.add_text(f"{METRIC_PREFIX}{summary.kind}_findings", text, self.step)
            writer.add_text(f"{METRIC_PREFIX}{summary.kind}_report", f"The HTML page: `{page_path}`", self.step)
        finally:
            writer.close()
        return f"TensorBoard events in {self.log_dir} (the page: {page_path})"
