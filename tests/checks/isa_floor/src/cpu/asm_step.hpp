// The check's fixture: a vector instruction in inline assembly outside the floor.
inline void step(int& acc) { asm("vpdpbusd %1, %1, %0" : "+v"(acc) : "v"(acc)); }
