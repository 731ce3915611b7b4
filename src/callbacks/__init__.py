"""Lightning callbacks the training recipes need beyond Lightning's own."""
