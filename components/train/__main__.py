"""`python -m components.train CONFIG --run-id ID --iteration I` (the train image's entry)."""

from components.core.stage_cli import stage_command
from components.train.launch import run

if __name__ == "__main__":
    stage_command("train", run)()
