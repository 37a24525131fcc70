"""Graph -> Graph passes; `pipeline.py` lists them in order."""
