"""What a spec shows a person: counts, LaTeX, a PDF, Markdown pages and a dataflow SVG."""
