"""`python -m components.generate CONFIG --run-id ID --iteration I` (the generate image's entry)."""

from components.core.stage_cli import stage_command
from components.generate.stage import run

if __name__ == "__main__":
    stage_command("generate", run, shardable=True)()
