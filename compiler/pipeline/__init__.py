"""The stages of one estimate, in order: load, validate, resolve, expand, evaluate, simulate, render."""
