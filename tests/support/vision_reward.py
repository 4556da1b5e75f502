"""A reward plugin for tests/generate/test_image_prompts.py: 1 for a response of odd length. Any policy, even an
untrained one, gets rewards that differ within a group, so GRPO's advantages are not zero."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)
