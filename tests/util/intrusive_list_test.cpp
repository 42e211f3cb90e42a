// IntrusiveList: FIFO order, erase from the middle, splice, erasing while iterating, and one
// object on two lists at once through two tagged hooks.
#include <vector>

#include <gtest/gtest.h>

#include "talaria/util/intrusive_list.hpp"

namespace talaria {
namespace {

struct Node : ListHook<> {
    explicit Node(int v) : value(v) {}
    int value;
};

std::vector<int> values(IntrusiveList<Node>& l) {
    std::vector<int> v;
    for (Node& n : l)
        v.push_back(n.value);
    return v;
}

TEST(IntrusiveList, PushPopFifo) {
    IntrusiveList<Node> l;
    EXPECT_TRUE(l.empty());
    EXPECT_EQ(l.size(), 0u);
    EXPECT_EQ(l.front(), nullptr);
    EXPECT_EQ(l.back(), nullptr);
    EXPECT_EQ(l.pop_front(), nullptr);

    Node a(1), b(2), c(3), z(0);
    l.push_back(a);
    l.push_back(b);
    l.push_back(c);
    l.push_front(z);
    EXPECT_EQ(l.size(), 4u);
    EXPECT_EQ(values(l), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(l.front(), &z);
    EXPECT_EQ(l.back(), &c);
    EXPECT_TRUE(a.linked());

    EXPECT_EQ(l.pop_front(), &z);
    EXPECT_FALSE(z.linked()) << "popped node must be unlinked";
    EXPECT_EQ(l.pop_front(), &a);
    EXPECT_EQ(l.pop_front(), &b);
    EXPECT_EQ(l.pop_front(), &c);
    EXPECT_EQ(l.pop_front(), nullptr);
    EXPECT_TRUE(l.empty());

    // Nodes can go back on after being popped.
    l.push_back(c);
    l.push_back(a);
    EXPECT_EQ(values(l), (std::vector<int>{3, 1}));
    l.clear();
    EXPECT_TRUE(l.empty());
    EXPECT_FALSE(a.linked());
    EXPECT_FALSE(c.linked());
}

TEST(IntrusiveList, EraseMiddleFirstLast) {
    IntrusiveList<Node> l;
    std::vector<Node> nodes;
    nodes.reserve(5);
    for (int i = 0; i < 5; ++i)
        nodes.emplace_back(i);
    for (auto& n : nodes)
        l.push_back(n);
    l.erase(nodes[2]);
    EXPECT_FALSE(nodes[2].linked());
    EXPECT_EQ(values(l), (std::vector<int>{0, 1, 3, 4}));
    l.erase(nodes[0]);
    EXPECT_EQ(values(l), (std::vector<int>{1, 3, 4}));
    l.erase(nodes[4]);
    EXPECT_EQ(values(l), (std::vector<int>{1, 3}));
    EXPECT_EQ(l.size(), 2u);
    EXPECT_EQ(l.front()->value, 1);
    EXPECT_EQ(l.back()->value, 3);
    l.erase(nodes[1]);
    l.erase(nodes[3]);
    EXPECT_TRUE(l.empty());
}

TEST(IntrusiveList, Splice) {
    IntrusiveList<Node> a, b;
    Node n1(1), n2(2), n3(3), n4(4);
    a.push_back(n1);
    b.push_back(n2);
    b.push_back(n3);
    a.splice_back(b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(b.size(), 0u);
    EXPECT_EQ(a.size(), 3u);
    EXPECT_EQ(values(a), (std::vector<int>{1, 2, 3}));
    EXPECT_EQ(a.back(), &n3);

    // Splicing an empty list is a no-op; splicing into an empty list moves everything.
    a.splice_back(b);
    EXPECT_EQ(a.size(), 3u);
    b.splice_back(a);
    EXPECT_EQ(values(b), (std::vector<int>{1, 2, 3}));
    EXPECT_TRUE(a.empty());

    // Both lists stay usable after a splice.
    a.push_back(n4);
    b.erase(n2);
    EXPECT_EQ(values(a), (std::vector<int>{4}));
    EXPECT_EQ(values(b), (std::vector<int>{1, 3}));

    // Splicing a list into itself changes nothing.
    b.splice_back(b);
    EXPECT_EQ(values(b), (std::vector<int>{1, 3}));
    EXPECT_EQ(b.size(), 2u);
    a.clear();
    b.clear();
}

TEST(IntrusiveList, MoveConstruct) {
    IntrusiveList<Node> a;
    Node n1(1), n2(2);
    a.push_back(n1);
    a.push_back(n2);
    IntrusiveList<Node> b(std::move(a));
    EXPECT_TRUE(a.empty());  // NOLINT: moved-from state is specified (empty)
    EXPECT_EQ(values(b), (std::vector<int>{1, 2}));
    b.clear();
}

TEST(IntrusiveList, ForEachSafeErasing) {
    IntrusiveList<Node> l;
    std::vector<Node> nodes;
    nodes.reserve(10);
    for (int i = 0; i < 10; ++i)
        nodes.emplace_back(i);
    for (auto& n : nodes)
        l.push_back(n);
    int visited = 0;
    l.for_each_safe([&](Node& n) {
        ++visited;
        if (n.value % 2 == 0) l.erase(n);
    });
    EXPECT_EQ(visited, 10);
    EXPECT_EQ(values(l), (std::vector<int>{1, 3, 5, 7, 9}));
    // Erase everything, moving each to another list while iterating.
    IntrusiveList<Node> other;
    l.for_each_safe([&](Node& n) {
        l.erase(n);
        other.push_back(n);
    });
    EXPECT_TRUE(l.empty());
    EXPECT_EQ(values(other), (std::vector<int>{1, 3, 5, 7, 9}));
    other.clear();
}

struct PendingTag {};
struct TimerTag {};
struct Request : ListHook<PendingTag>, ListHook<TimerTag> {
    explicit Request(int v) : value(v) {}
    int value;
};

TEST(IntrusiveList, TwoHooksWithTags) {
    IntrusiveList<Request, PendingTag> pending;
    IntrusiveList<Request, TimerTag> timers;
    Request r1(1), r2(2), r3(3);
    pending.push_back(r1);
    pending.push_back(r2);
    pending.push_back(r3);
    timers.push_back(r3);
    timers.push_back(r1);
    EXPECT_EQ(pending.size(), 3u);
    EXPECT_EQ(timers.size(), 2u);

    // Erasing from one list leaves the other untouched.
    pending.erase(r1);
    EXPECT_FALSE(static_cast<ListHook<PendingTag>&>(r1).linked());
    EXPECT_TRUE(static_cast<ListHook<TimerTag>&>(r1).linked());
    std::vector<int> t;
    for (Request& r : timers)
        t.push_back(r.value);
    EXPECT_EQ(t, (std::vector<int>{3, 1}));
    std::vector<int> p;
    for (Request& r : pending)
        p.push_back(r.value);
    EXPECT_EQ(p, (std::vector<int>{2, 3}));

    EXPECT_EQ(timers.pop_front(), &r3);
    EXPECT_TRUE(static_cast<ListHook<PendingTag>&>(r3).linked());
    EXPECT_EQ(pending.back(), &r3);
    pending.clear();
    timers.clear();
}

TEST(IntrusiveList, DestructorUnlinks) {
    Node a(1);
    {
        IntrusiveList<Node> l;
        l.push_back(a);
        EXPECT_TRUE(a.linked());
    }
    EXPECT_FALSE(a.linked()) << "a destroyed list must unlink its elements";
    IntrusiveList<Node> l2;
    l2.push_back(a);  // would assert if still linked
    EXPECT_EQ(l2.size(), 1u);
    l2.clear();
}

}  // namespace
}  // namespace talaria
