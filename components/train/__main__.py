"""`python -m components.train CONFIG --run-id ID --iteration I` or `--segment S` (the train image's entry)."""

from components.core.stage_cli import stage_command
from components.train.launch import run, serve

if __name__ == "__main__":
    stage_command("train", run, serve=serve)()
