"""The grading pipeline, in data order: collect → jail → replay → facts → verdict → gradebook."""
