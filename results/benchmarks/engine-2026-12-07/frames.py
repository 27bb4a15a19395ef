"""Count Python frames between `train_command` (the click command) and the step's math, on the CPU."""
import sys, inspect
from click.testing import CliRunner
from ksae_cupy.cli.train import train_command
import ksae_cupy.cli as cli

TARGETS = {"loss_and_grads_sparse", "loss_and_grads"}
seen = []

def prof(frame, event, arg):
    if event == "call" and frame.f_code.co_name in TARGETS and not seen:
        names = []
        f = frame
        while f is not None:
            names.append(f"{f.f_code.co_filename.split('ksae_cupy/')[-1]}:{f.f_code.co_name}")
            if f.f_code.co_name == "main" and "click" in f.f_code.co_filename:
                break
            f = f.f_back
        seen.append(names)

run_dir = sys.argv[1]
sys.setprofile(prof)
from ksae_cupy.cli.train import train_command as cmd
r = CliRunner().invoke(cmd, ["synthetic", "--epochs", "1", "--hidden", "64", "--k", "8", "--threads", "1", "--run-dir", run_dir] + sys.argv[2:], catch_exceptions=False)
sys.setprofile(None)
print(r.output[-500:])
names = seen[0]
for n in reversed(names): print("  ", n)
print("frames below click main, to the math (inclusive):", len(names) - 1)
