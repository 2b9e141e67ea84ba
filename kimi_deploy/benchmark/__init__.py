"""The serving benchmark a recipe's ``benchmark`` asks for (``deploys/bench.py``): its plan, the
judging of each task's answer, the report with its cost, the delta against the last run, and its
picture. Not the project's own measurements, which live in ``bench/``."""
