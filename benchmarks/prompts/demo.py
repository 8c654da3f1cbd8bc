import os


def count_lines(path):
    """Return the number of lines in the file at path."""
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def count_words(path):
    """Return the number of words in the file at path."""
