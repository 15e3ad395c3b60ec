/* tests/support/timeout.h — Criterion's per-test timeouts, in seconds of an optimised build on
 * an idle machine. A sanitizer build (ASan+UBSan at -O0) runs several times slower, and CI's
 * machine may be busy: there LM_TIMEOUT gives six times the room. A timeout only catches hangs;
 * what a test asserts never depends on how long it took. */
#ifndef LUMEN_TESTS_TIMEOUT_H
#define LUMEN_TESTS_TIMEOUT_H

#if defined(__SANITIZE_ADDRESS__)
#define LM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LM_TEST_SANITIZED 1
#endif
#endif

#ifdef LM_TEST_SANITIZED
#define LM_TIMEOUT(s) (6.0 * (s))
#else
#define LM_TIMEOUT(s) (1.5 * (s))
#endif

#endif
