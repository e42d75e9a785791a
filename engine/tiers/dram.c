/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/dram.c — the DRAM tier (tiers.h).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tiers.h"

#define PAGE 4096u

struct kv_dram_entry {
  uint8_t hash[16];
  uint64_t first_page, n_pages, len;
  int pins;
  int visible; /* published (fill finished) */
  int dead;    /* removed while pinned: free on last unpin */
  int staged;  /* put here by a prefetch and not read since: evicted after the others */
  kv_dram_entry *hnext;        /* hash chain */
  kv_dram_entry *prev, *next;  /* LRU list, most recent at head */
};

struct kv_dram {
  pthread_mutex_t mu;
  uint8_t *mem;
  uint64_t n_pages;
  uint64_t *bitmap; /* 1 = used */
  kv_dram_entry **table;
  uint64_t table_size;
  kv_dram_entry *head, *tail;
  uint64_t bytes, blocks, hits, misses, capacity;
};

static uint64_t slot(const kv_dram *d, const uint8_t *h)
{
  uint64_t v;
  memcpy(&v, h, 8);
  return v & (d->table_size - 1);
}

kv_dram *kv_dram_create(uint64_t capacity)
{
  uint64_t n_pages = capacity / PAGE;
  if (n_pages == 0)
    return NULL;
  kv_dram *d = calloc(1, sizeof *d);
  if (d == NULL)
    return NULL;
  d->n_pages = n_pages;
  d->capacity = n_pages * PAGE;
  d->mem = mmap(NULL, d->capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  d->bitmap = calloc((n_pages + 63) / 64, 8);
  d->table_size = 1024;
  while (d->table_size < n_pages / 4)
    d->table_size *= 2;
  d->table = calloc(d->table_size, sizeof *d->table);
  if (d->mem == MAP_FAILED || d->bitmap == NULL || d->table == NULL) {
    if (d->mem != MAP_FAILED)
      munmap(d->mem, d->capacity);
    free(d->bitmap);
    free(d->table);
    free(d);
    return NULL;
  }
  pthread_mutex_init(&d->mu, NULL);
  return d;
}

void kv_dram_destroy(kv_dram *d)
{
  if (d == NULL)
    return;
  for (uint64_t i = 0; i < d->table_size; i++) {
    kv_dram_entry *e = d->table[i];
    while (e != NULL) {
      kv_dram_entry *n = e->hnext;
      free(e);
      e = n;
    }
  }
  munmap(d->mem, d->capacity);
  free(d->bitmap);
  free(d->table);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

void kv_dram_region(const kv_dram *d, void **base, size_t *bytes)
{
  *base = d->mem;
  *bytes = (size_t)d->capacity;
}

static int page_used(const kv_dram *d, uint64_t p)
{
  return (d->bitmap[p / 64] >> (p % 64)) & 1;
}

static void mark(kv_dram *d, uint64_t first, uint64_t n, int used)
{
  for (uint64_t p = first; p < first + n; p++) {
    if (used)
      d->bitmap[p / 64] |= 1ull << (p % 64);
    else
      d->bitmap[p / 64] &= ~(1ull << (p % 64));
  }
}

/* First fit of n contiguous free pages; UINT64_MAX when none. */
static uint64_t find_run(const kv_dram *d, uint64_t n)
{
  uint64_t run = 0;
  for (uint64_t p = 0; p < d->n_pages; p++) {
    if ((p % 64) == 0 && d->bitmap[p / 64] == ~0ull && p + 64 <= d->n_pages) {
      run = 0;
      p += 63;
      continue;
    }
    if (page_used(d, p)) {
      run = 0;
    } else if (++run == n) {
      return p + 1 - n;
    }
  }
  return UINT64_MAX;
}

static void lru_unlink(kv_dram *d, kv_dram_entry *e)
{
  if (e->prev)
    e->prev->next = e->next;
  else
    d->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    d->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push(kv_dram *d, kv_dram_entry *e)
{
  e->prev = NULL;
  e->next = d->head;
  if (d->head)
    d->head->prev = e;
  d->head = e;
  if (d->tail == NULL)
    d->tail = e;
}

static kv_dram_entry *find(kv_dram *d, const uint8_t *h)
{
  for (kv_dram_entry *e = d->table[slot(d, h)]; e != NULL; e = e->hnext)
    if (!e->dead && memcmp(e->hash, h, 16) == 0)
      return e;
  return NULL;
}

static void unhash(kv_dram *d, kv_dram_entry *e)
{
  kv_dram_entry **pp = &d->table[slot(d, e->hash)];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
}

/* Free an entry's pages and the entry (caller holds the lock; entry unpinned). */
static void release(kv_dram *d, kv_dram_entry *e)
{
  mark(d, e->first_page, e->n_pages, 0);
  if (e->visible) {
    d->bytes -= e->len;
    d->blocks--;
  }
  free(e);
}

static void drop(kv_dram *d, kv_dram_entry *e)
{
  unhash(d, e);
  lru_unlink(d, e);
  if (e->pins > 0) {
    e->dead = 1;
    return;
  }
  release(d, e);
}

kv_dram_entry *kv_dram_pin(kv_dram *d, const uint8_t hash[16], const uint8_t **data,
                           uint64_t *len)
{
  pthread_mutex_lock(&d->mu);
  kv_dram_entry *e = find(d, hash);
  if (e == NULL || !e->visible) {
    d->misses++;
    pthread_mutex_unlock(&d->mu);
    return NULL;
  }
  e->pins++;
  d->hits++;
  e->staged = 0; /* the read it was staged for (or another) has come */
  lru_unlink(d, e);
  lru_push(d, e);
  *data = d->mem + e->first_page * PAGE;
  *len = e->len;
  pthread_mutex_unlock(&d->mu);
  return e;
}

int kv_dram_contains(kv_dram *d, const uint8_t hash[16])
{
  pthread_mutex_lock(&d->mu);
  kv_dram_entry *e = find(d, hash);
  int present = e != NULL && e->visible;
  pthread_mutex_unlock(&d->mu);
  return present;
}

int kv_dram_keep(kv_dram *d, const uint8_t hash[16])
{
  pthread_mutex_lock(&d->mu);
  kv_dram_entry *e = find(d, hash);
  int present = e != NULL && e->visible;
  if (present)
    e->staged = 1;
  pthread_mutex_unlock(&d->mu);
  return present;
}

void kv_dram_unpin(kv_dram *d, kv_dram_entry *e)
{
  if (e == NULL)
    return;
  pthread_mutex_lock(&d->mu);
  if (--e->pins == 0 && e->dead)
    release(d, e);
  pthread_mutex_unlock(&d->mu);
}

/* The entry to evict: the least recently used unpinned one that is not staged, else the least
 * recently used unpinned one; NULL when every entry is pinned. */
static kv_dram_entry *victim(kv_dram *d)
{
  kv_dram_entry *any = NULL;
  for (kv_dram_entry *v = d->tail; v != NULL; v = v->prev) {
    if (v->pins > 0)
      continue;
    if (!v->staged)
      return v;
    if (any == NULL)
      any = v;
  }
  return any;
}

static int insert(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len,
                  int staged)
{
  uint64_t n = (len + PAGE - 1) / PAGE;
  if (n == 0 || n > d->n_pages)
    return -1;
  pthread_mutex_lock(&d->mu);
  kv_dram_entry *had = find(d, hash);
  if (had != NULL) {
    if (staged && had->visible)
      had->staged = 1;
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  uint64_t first;
  while ((first = find_run(d, n)) == UINT64_MAX) {
    kv_dram_entry *v = victim(d);
    if (v == NULL) {
      pthread_mutex_unlock(&d->mu);
      return -1;
    }
    drop(d, v);
  }
  kv_dram_entry *e = calloc(1, sizeof *e);
  if (e == NULL) {
    pthread_mutex_unlock(&d->mu);
    return -1;
  }
  memcpy(e->hash, hash, 16);
  e->first_page = first;
  e->n_pages = n;
  e->len = len;
  e->staged = staged;
  e->pins = 1; /* held by this filler */
  mark(d, first, n, 1);
  uint64_t s = slot(d, hash);
  e->hnext = d->table[s];
  d->table[s] = e;
  lru_push(d, e);
  pthread_mutex_unlock(&d->mu);

  memcpy(d->mem + first * PAGE, data, len);

  pthread_mutex_lock(&d->mu);
  e->visible = 1;
  d->bytes += len;
  d->blocks++;
  if (--e->pins == 0 && e->dead)
    release(d, e);
  pthread_mutex_unlock(&d->mu);
  return 0;
}

int kv_dram_insert(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len)
{
  return insert(d, hash, data, len, 0);
}

int kv_dram_stage(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len)
{
  return insert(d, hash, data, len, 1);
}

void kv_dram_remove(kv_dram *d, const uint8_t hash[16])
{
  pthread_mutex_lock(&d->mu);
  kv_dram_entry *e = find(d, hash);
  if (e != NULL)
    drop(d, e);
  pthread_mutex_unlock(&d->mu);
}

void kv_dram_stat(kv_dram *d, kv_dram_stats *out)
{
  pthread_mutex_lock(&d->mu);
  out->capacity = d->capacity;
  out->bytes = d->bytes;
  out->blocks = d->blocks;
  out->hits = d->hits;
  out->misses = d->misses;
  pthread_mutex_unlock(&d->mu);
}
