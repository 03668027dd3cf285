"""How each topic's rows, captions and prose come out of its result files' JSON; sections.py places them."""
