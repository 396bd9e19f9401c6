"""Answer quality: the GSM8K questions a campaign asks (gsm8k), the grading rule (grade), and the exact
statistics over graded replies (stats). Pure code: files are read and written through harness.formats."""
