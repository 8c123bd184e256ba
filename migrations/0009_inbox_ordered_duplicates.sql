-- txbox 0009: an ordered delivery that duplicates a row already stored (its
-- handler's dedupeKey is taken: the same business event sent twice) keeps its
-- place in its key's sequence. It is stored under a key of its own with the
-- dedupe key it repeats in duplicate_of; when its turn comes the processor
-- marks it processed without running the handler, and the key moves on.
-- Nullable, no default: adding it rewrites nothing.
ALTER TABLE inbox ADD COLUMN duplicate_of text;
