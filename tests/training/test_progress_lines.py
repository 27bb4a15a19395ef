"""What a log (stderr not a terminal) holds between epoch lines: a progress line only a full interval after the
last line, never the epoch's last batch (its epoch line follows at once); after --resume the estimate tells
what is left, not the whole run's time."""
from ksae_cupy.session.progress import RunProgress
from ksae_cupy.training.trainer import TrainConfig


class FakeTrainer:
    config = TrainConfig(epochs=12, batch_size=100, k=25, k_start=25)
    epoch, step, batch_in_epoch, finished = 0, 0, 0, False


class Report:
    epoch, k, lr, train_loss, valid_loss, dead_fraction, samples_per_s, seconds = 1, 25, 0.01, 1.0, 1.0, 0.0, 1.0, 1.0
    fve = valid_fve = l0 = valid_l0 = None


def progress_of(trainer, now, said):
    return RunProgress(trainer, n_train=1000, enabled=True, tty=False, interval_s=30.0, clock=lambda: now[0],
                       echo=lambda text, **_: said.append(text))


def test_no_progress_line_at_an_epochs_last_batch_nor_just_after_its_epoch_line():
    now, said, trainer = [0.0], [], FakeTrainer()
    progress = progress_of(trainer, now, said)
    now[0] = 40.0
    progress.on_batch(10, 10)  # the last batch: its epoch line comes next
    assert said == []
    progress.after_epoch(Report())
    now[0] = 45.0
    trainer.batch_in_epoch = 1
    progress.on_batch(1, 10)  # 45 s after the start, 5 s after the epoch line: no stray line
    assert said == []
    now[0] = 71.0
    progress.on_batch(3, 10)
    assert len(said) == 1 and said[0].startswith("  epoch 1/12  batch 1/10")


def test_the_estimate_after_a_resume_tells_what_is_left():
    now, said, trainer = [0.0], [], FakeTrainer()
    trainer.epoch, trainer.step = 11, 110  # resumed after 11 of 12 epochs
    progress = progress_of(trainer, now, said)
    trainer.step, now[0] = 115, 5.0
    lines = progress.after_epoch(Report())
    estimate = [line for line in lines if line.startswith("estimate: ")]
    assert estimate and estimate[0].startswith("estimate: 1 of 12 epochs left at 10.0 s each: "), estimate
