"""What every command stands on: settings from the command line and the one-sentence errors (cli.py), the hardware
(device.py, distributed.py), compiling and MFU (speed.py), files written so that a failure loses nothing and JSON read
back (files.py), a run directory's lock (lock.py), its log, the checkpoint's reader and the code a run trained with
(run_log.py, checkpoint.py, fingerprint.py), the MoE's grouped matmul, progress and Weights & Biases. It imports
nothing of the project above it."""
