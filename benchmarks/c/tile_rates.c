/* The integer kernel's tiles alone, panels in cache: ns a row and block of 16 columns (512 multiply-adds) for each
   format and row count, one thread. Built by benchmarks/tile_rates.py with a level's flags around the kernel's own
   source (KERNEL_SOURCE), so its static tiles run as the kernel runs them. Prints one line a cell:
   "fmt rows ns". */
#include KERNEL_SOURCE
#include <stdio.h>
#include <time.h>

#define BLOCKS 48   /* k = 1536: a panel is at most 48 x 544 bytes and its tail; PANELS of them stay in L2 */
#define PANELS 4
#define CALLS 300   /* tile calls a timing, over the PANELS in turn */

static uint8_t panel[PANELS][BLOCKS * 600 + 4096] __attribute__((aligned(64)));
static int8_t xq[MT * BLOCKS * QK];
static float xd[MT * BLOCKS], xc[MT * BLOCKS], out[MT * NB];
static int32_t xs[MT * BLOCKS], xh[MT * BLOCKS];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 30;
    /* any byte is a valid quant; every fp16 in the tails 1.0, every int8 scale 0 or 60 */
    for (int p = 0; p < PANELS; p++)
        for (size_t i = 0; i < sizeof panel[0]; i++)
            panel[p][i] = i < BLOCKS * 256 ? (uint8_t)(i * 131 + p * 7) : (i % 2 ? 0x3c : 0x00);
    for (int i = 0; i < MT * BLOCKS * QK; i++) xq[i] = (int8_t)((i * 37) % 255 - 127);
    for (int i = 0; i < MT * BLOCKS; i++) { xd[i] = 1.0f; xc[i] = 1.0f; xs[i] = i % 64; xh[i] = i % 32; }
    const int formats[] = {8, 5, 4, 41, 42, 52, 62};
    for (int f = 0; f < 7; f++) {
        const tile_fn *tiles = tiles_of(formats[f]);
        for (int r = 1; r <= MT; r++) {
            double best = 1e9;
            for (int k = 0; k < rounds; k++) {
                double t0 = now();
                for (int c = 0; c < CALLS; c++)
                    tiles[r](xq, xd, xs, xh, xc, BLOCKS, panel[c % PANELS], 0, out);
                double t = now() - t0;
                if (t < best) best = t;
            }
            printf("%d %d %.3f\n", formats[f], r, best / ((double)CALLS * BLOCKS * r) * 1e9);
        }
    }
    return out[0] != out[0]; /* the outputs read: the calls are not dropped */
}
