/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/shared_paths.h — where the tools look for the test and demo data of ../shared
 * (the stories260K model and the TinyStories corpus) when no path is given on the command line.
 * Nothing of ../shared is part of the repository; these are only default locations.
 *
 *   model      $KVDB_MODEL_DIR/stories260K/, else $KVDB_SHARED_DIR/models/stories260K/, else
 *              <shared_dir>/models/stories260K/ (meson option shared_dir, default ../shared
 *              beside the source tree); files stories260K.bin and tok512.bin
 *   corpus     $KVDB_CORPUS_DIR/tinystories/, else $KVDB_SHARED_DIR/corpora/tinystories/, else
 *              <shared_dir>/corpora/tinystories/; file tinystories_validation_head.txt
 *
 * An environment variable that is set but empty counts as unset.
 */
#ifndef KVDB_SHARED_PATHS_H
#define KVDB_SHARED_PATHS_H

#include <stddef.h>

/* Fill model and tok (cap bytes each) with the first candidate where both files exist and
 * return 0; otherwise return -1 with every path tried listed in looked. */
int shared_find_model(char *model, char *tok, size_t cap, char *looked, size_t looked_cap);

/* Same for the TinyStories corpus file. */
int shared_find_corpus(char *corpus, size_t cap, char *looked, size_t looked_cap);

#endif
