#include <collx/collx.hpp>
struct fake { int rank() const { return 0; } int size() const { return 1; } };
int main() { collx::communicator<fake> c{fake{}}; }
