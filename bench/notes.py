"""The narrative part of bench/RESULTS.md: what the figures mean and what was
changed to reach them. Kept here so that every run writes it again."""

NOTES = """
## Notes

(to be written)
"""
