// An old spelling: a header that moved to its floor's folder names where it went.
#include <collx/communicator.hpp>
int main() {}
