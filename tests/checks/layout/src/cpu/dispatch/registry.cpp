// planted: naive is reached, orphan is not
list.push_back({{&cpu::naive()}});
