"""One module per command (group). Modules import nothing heavy at the top."""
