// The check's fixture: an algorithm over the floor's names, an OS #if: nothing to report.
#if defined(__linux__)
inline int lanes() { return 16; }
#endif
inline void keep(float& v) { asm("" : "+v"(v)); }
