"""The formula files: their loader, compiler and worked examples."""
